# No hang without a deadline. A rank stopped with SIGSTOP in the middle of a 2-rank training with
# --dist.timeout_s=5: the job ends within ~15 s with a non-zero exit and one line naming the waiting rank, its host,
# the operation and the group, and no rank is left behind. Ranks launched with different subcommands (an MPMD
# mpirun line) are refused at start-up with a line naming the rank and both subcommands instead of waiting in each
# other's collectives.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
run="$WORK/stopped"
cleanup() {  # without the fix the job never ends: take down what this test started
  local p
  for p in $(procs bin/yuanlm); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# ended LOG RC START LIMIT: the job's exit code and time; it must have ended by itself, within LIMIT seconds.
ended() {
  local log=$1 rc=$2 start=$3 limit=$4 took
  took=$($PY -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$start" "$(date +%s.%N)")
  echo "exit $rc after ${took} s"
  grep "^error:" "$log" || true
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -5 "$log"; echo "the job did not end by itself"; exit 1; }
  $PY -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$took" "$limit" ||
    { echo "took ${took} s, not < $limit s"; exit 1; }
}

(exec timeout 60 mpirun -np 2 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$run" \
  --train.steps=100000 --train.global_batch=8 --train.micro_batch=4 --ckpt.every=0 --dist.timeout_s=5 \
  >"$WORK/stopped.log" 2>&1) &
job=$!
for _ in $(seq 300); do [ -f "$run/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1; done
victim=$(procs bin/yuanlm | tail -1)
[ -n "$victim" ] || { cat "$WORK/stopped.log"; echo "no rank to stop"; exit 1; }
kill -STOP "$victim"
start=$(date +%s.%N)
set +e
wait "$job"
rc=$?
set -e
ended "$WORK/stopped.log" "$rc" "$start" 15
[ "$(grep -c '^error:' "$WORK/stopped.log")" -eq 1 ] || { echo "not one error line"; exit 1; }
# The seconds the line gives are those the watchdog saw, 5 or a little more when the machine is loaded (the time
# limit above bounds them).
grep -Eq "^error: \[rank [01]@[^]]+\] no progress for [0-9]+ s: waiting in [a-z_]+ on group .*dist.timeout_s 5" \
  "$WORK/stopped.log" || { echo "the line does not name the rank, host, operation and group"; exit 1; }
sleep 1
[ -z "$(procs bin/yuanlm)" ] || { echo "ranks left behind: $(procs bin/yuanlm)"; exit 1; }

echo "== mpmd"
set +e
timeout 60 mpirun -np 1 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/mpmd" \
  : -np 1 bin/yuanlm eval --checkpoint "$WORK/mpmd" >"$WORK/mpmd.log" 2>&1
rc=$?
set -e
echo "exit $rc"
grep "^error:" "$WORK/mpmd.log" || true
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -5 "$WORK/mpmd.log"; echo "the MPMD job was not refused"; exit 1; }
grep -q "^error: \[rank 0@[^]]*\] the ranks run different commands: rank 1@[^ ]* runs 'yuanlm eval', rank 0@[^ ]* \
runs 'yuanlm train'" "$WORK/mpmd.log" || { echo "the refusal does not name the rank and both commands"; exit 1; }
[ ! -e "$WORK/mpmd" ] || { echo "the refused training wrote into its run.dir"; exit 1; }

echo "== start-up"
# Rank 1 stops itself before it starts yuanlm, as a rank whose node went away while the job started: rank 0 waits
# in MPI_Init's fence, where the watchdog does not run yet; the start-up deadline (YUANLM_START_TIMEOUT_S) ends it.
start=$(date +%s.%N)
set +e
YUANLM_START_TIMEOUT_S=4 timeout 60 mpirun -np 2 -x YUANLM_START_TIMEOUT_S sh -c \
  '[ "$OMPI_COMM_WORLD_RANK" != 1 ] || kill -STOP $$; exec "$@"' sh bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/startup" >"$WORK/startup.log" 2>&1
rc=$?
set -e
ended "$WORK/startup.log" "$rc" "$start" 20
grep -Eq "^error: \[rank 0@[^]]+\] MPI start-up \(MPI_Init and the first collectives over the world\) did not finish \
in 4 s" "$WORK/startup.log" || { cat "$WORK/startup.log"; echo "no start-up line naming the rank and the deadline"; exit 1; }
