# A rank that dies of a fatal signal says so (util/crash_report.h): SIGSEGV sent to one rank of a 2-rank training
# once it has begun steps. Its log gets one line naming the rank, its node, its pid, the signal and the sender,
# then the backtrace; Open MPI's own report ("Signal: Segmentation fault") does not appear, as MPI_Init leaves the
# signal to ours; the rank still ends with the signal itself (mpirun names signal 11), mpirun exits non-zero and no
# rank is left running.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
run="$WORK/run"
cleanup() {  # a rank the job failed to end would otherwise outlive the test
  local p
  for p in $(procs bin/yuanlm) $(procs mpirun); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
start=$SECONDS
(exec timeout 60 mpirun -np 2 bin/yuanlm train input/tiny.ini "${TINY[@]}" --data.train="$WORK/corpus/*.h5" \
  --data.val= --run.dir="$run" --train.steps=1000000 --train.global_batch=4 --train.micro_batch=2 --ckpt.every=0 \
  >"$WORK/log" 2>&1) &
job=$!
for _ in $(seq 300); do
  [ -f "$run/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -ge 2 ] && break
  sleep 0.05
done
[ -f "$run/metrics.jsonl" ] || { cat "$WORK/log"; echo "training did not begin"; exit 1; }
victim=
for p in $(procs bin/yuanlm); do
  tr '\0' '\n' <"/proc/$p/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
done
[ -n "$victim" ] || { cat "$WORK/log"; echo "no rank 1 among $(procs bin/yuanlm)"; exit 1; }
kill -SEGV "$victim"
set +e
wait "$job"
rc=$?
set -e
grep -v '^step ' "$WORK/log" | tail -30
echo "mpirun: exit $rc"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected mpirun to fail at once, got exit $rc"; exit 1; }
line="yuanlm: rank 1 on $(hostname) (pid $victim): fatal signal 11 (SIGSEGV) sent by pid $BASHPID; backtrace:"
grep -qxF "$line" "$WORK/log" || { echo "no line: $line"; exit 1; }
# The frames right after it: backtrace_symbols_fd's "object(symbol+offset)[address]", one of them this binary's.
after=$(grep -A8 -xF "$line" "$WORK/log" | tail -n +2)
frames=$(grep -cE '^[^ ]+\(.*\)\[0x[0-9a-f]+\]$' <<<"$after" || true)
[ "$frames" -ge 5 ] || { echo "expected a backtrace after the line, got $frames frame lines"; exit 1; }
grep -q '^bin/yuanlm(' <<<"$after" || { echo "no frame of bin/yuanlm"; exit 1; }
! grep -q "Signal: Segmentation fault" "$WORK/log" || { echo "Open MPI's own report is there too"; exit 1; }
grep -q "exited on signal 11" "$WORK/log" || { echo "mpirun does not say the rank ended with signal 11"; exit 1; }
for _ in $(seq 50); do [ -z "$(procs bin/yuanlm)" ] && break; sleep 0.1; done
left=$(procs bin/yuanlm)
[ -z "$left" ] || { ps -o pid,stat,args -p "$(paste -sd, <<<"$left")"; echo "ranks left running"; exit 1; }
echo "crash reported, job ended in $((SECONDS - start)) s"
