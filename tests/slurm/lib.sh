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
  source tests/slurm/daemons.sh
  slurm_daemon_logs "${YUANLM_SLURM_DIR:-/tmp/yuanlm-slurm}"
  for f in "$WORK"/logs/*.out; do
    [ -s "$f" ] || continue
    echo "--- $f (last 30 lines)"
    tail -30 "$f"
  done
}

# slurm_client CMD...: a SLURM client command (scontrol, squeue, sbatch) where the controller can be reached: here;
# the test cluster's SLURM (tests/cluster/lib.sh) redefines it to run on one of its nodes.
slurm_client() { "$@"; }

# job_field JOBID FIELD: one field of the job, from the snapshot wait_jobs took when it ended, else from
# `scontrol show job` (which forgets a job MinJobAge=16 s after it ends).
job_field() {
  local snap="$WORK/.job-$1.state"
  { [ -f "$snap" ] && cat "$snap" || slurm_client scontrol show job -o "$1" 2>/dev/null; } | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
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
      st=$(slurm_client scontrol show job -o "$id" 2>/dev/null)
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
  for id in "$@"; do [ -f "$WORK/.job-$id.state" ] || slurm_client scontrol show job "$id" | head -5; done
  return 1
}

# requeue_and_check NAME ID STEPS: job ID, jobs/train.sbatch of STEPS steps named NAME submitted from $WORK, is sent
# SIGUSR1 (`scancel --signal=USR1`: the delivery of the time-limit warning without B:, at a moment the test
# chooses) once it has logged 5 steps; it must checkpoint, exit 75, be requeued by the script, start again (same
# id, Restarts=1), resume from the checkpoint and complete every step exactly once.
requeue_and_check() {
  local name=$1 id=$2 steps=$3 run out t0 step
  run=$WORK/runs/$name-$id out=$WORK/logs/$name-$id.out t0=$(date +%s)
  for _ in $(seq 600); do
    [ -f "$run/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -ge 5 ] && break
    sleep 0.1
  done
  [ "$(grep -c '"loss"' "$run/metrics.jsonl" 2>/dev/null)" -ge 5 ] || { echo "job $id made no progress"; exit 1; }
  slurm_client scancel --signal=USR1 "$id"
  echo "signalled job $id at step $(grep -c '"loss"' "$run/metrics.jsonl") after $(($(date +%s) - t0)) s"
  wait_jobs 150 "$id"
  echo "== $name (job $id) ended after $(($(date +%s) - t0)) s: $(job_field "$id" JobState), exit $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts)"
  cat "$out"
  [ "$(job_field "$id" JobState)" = COMPLETED ] && [ "$(job_field "$id" ExitCode)" = 0:0 ] ||
    { echo "job did not complete"; exit 1; }
  [ "$(job_field "$id" Restarts)" = 1 ] || { echo "expected 1 restart"; exit 1; }
  step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\).*/\1/p' "$out" | head -1)
  [ -n "$step" ] && [ "$step" -lt "$steps" ] || { echo "the first incarnation did not stop early"; exit 1; }
  grep -q "requeueing job $id (restart 1)" "$out"
  grep -q "job $name $id (restart 1)" "$out"
  grep -q "resumed from runs/$name-$id/ckpt/step_$(printf %07d "$step"): step $step" "$out" ||
    { echo "no resume from step $step"; exit 1; }
  grep -q "done: $((steps - step)) steps" "$out"
  if grep -q "got SIGUSR1; passing it" "$out"; then echo "the batch shell got the signal"; exit 1; fi
  # The run.dir copy holds both incarnations; jobs.tsv one line each: exit 75 then 0.
  [ "$(grep -c "launcher exited" "$run/job-$id.log")" -eq 2 ]
  awk -F'\t' '{ printf "%s:%s ", $2, $5 } END { print "" }' "$run/jobs.tsv" | grep -qx "0:75 1:0 " ||
    { echo "bad jobs.tsv:"; cat "$run/jobs.tsv"; exit 1; }
  # metrics.jsonl: every step once, in order (the resumed run rewrote nothing before its checkpoint)
  /usr/bin/python3 - "$run/metrics.jsonl" "$steps" <<'PYEOF'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
PYEOF
  [ -f "$run/ckpt/step_$(printf %07d "$steps")/state.json" ]
  echo "checkpointed at step $step, exit 75, requeued, resumed and completed $steps steps"
}
