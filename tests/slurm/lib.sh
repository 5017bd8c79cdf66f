# shellcheck shell=bash
# Sourced by the tests in tests/mpi/ that submit real SLURM jobs, after tests/mpi/lib.sh (which sets WORK and
# cds to the repository root). slurm_up starts the private one-node SLURM of tests/slurm/start.sh for this test
# and stops it when the test exits; where SLURM cannot run it prints the reason and exits 77 (skipped).
# Tests that use SLURM take a lock first (fd 9, held until the test exits), so two of them never share or fight
# over the daemons; start.sh and stop.sh run by hand wait for it too.

slurm_up() {
  slurm_try_up && return 0
  echo "SKIP: $(basename "$0" .sh): SLURM cannot run on this machine (see the SKIP line above)"
  exit 77
}

# slurm_try_up: as slurm_up, but returns 1 instead of exiting where SLURM cannot run.
slurm_try_up() {
  local out rc
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: SLURM cannot run here: not root (the test daemons need root)"
    return 1
  fi
  source tests/slurm/lock.sh
  if ! slurm_lock; then
    echo "another test held $SLURM_LOCK for 15 minutes"
    exit 1
  fi
  out=$(tests/slurm/start.sh)
  rc=$?
  [ "$rc" -eq 77 ] && return 1
  [ "$rc" -eq 0 ] || { echo "tests/slurm/start.sh failed with exit $rc"; exit 1; }
  eval "$out"
  export SLURM_CONF
  trap 'slurm_down' EXIT
}

slurm_down() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    slurm_logs
  fi
  tests/slurm/stop.sh
  rm -rf "$WORK"
}

# The daemons' last log lines and every job output under $WORK: printed when a test fails.
slurm_logs() {
  local f
  for f in "${YUANLM_SLURM_DIR:-/tmp/yuanlm-slurm}"/log/slurm*.log "$WORK"/logs/*.out; do
    [ -s "$f" ] || continue
    echo "--- $f (last 30 lines)"
    tail -30 "$f"
  done
}

# job_field JOBID FIELD: one field of the job, from the snapshot wait_jobs took when it ended, else from
# `scontrol show job` (which forgets a job MinJobAge=16 s after it ends).
job_field() {
  local snap="$WORK/.job-$1.state"
  { [ -f "$snap" ] && cat "$snap" || scontrol show job -o "$1" 2>/dev/null; } | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# wait_jobs TIMEOUT_S JOBID...: waits until every job has ended for good (not pending, running, or requeued),
# keeping a snapshot of each one's final state for job_field.
wait_jobs() {
  local t=$1 id st pending
  shift
  for _ in $(seq "$((t * 2))"); do
    pending=0
    for id in "$@"; do
      [ -f "$WORK/.job-$id.state" ] && continue
      st=$(scontrol show job -o "$id" 2>/dev/null)
      case "$(echo "$st" | tr ' ' '\n' | sed -n 's/^JobState=//p')" in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | DEADLINE | BOOT_FAIL)
          echo "$st" >"$WORK/.job-$id.state" ;;
        *) pending=1 ;;
      esac
    done
    [ "$pending" = 0 ] && return 0
    sleep 0.5
  done
  echo "jobs still not done after ${t} s:"
  for id in "$@"; do [ -f "$WORK/.job-$id.state" ] || scontrol show job "$id" | head -5; done
  return 1
}
