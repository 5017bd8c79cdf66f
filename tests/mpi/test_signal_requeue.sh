# SIGUSR1 to mpirun (what SLURM's --signal=USR1@120 delivers) and SIGTERM to the ranks (what SLURM sends at the
# time limit) make every rank finish its step, checkpoint and exit 75; the requeued job resumes from there.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=100000 --train.global_batch=8 --train.micro_batch=4 --ckpt.every=0)
wait_for_step() {  # RUN_DIR STEP
  for _ in $(seq 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "no step $2 in $1"; return 1
}
for how in usr1-mpirun term-ranks; do
  run="$WORK/$how"
  echo "== $how"
  # exec: $! must be mpirun itself, the process a batch system signals
  (exec mpirun -np 2 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" \
    >"$WORK/$how.log" 2>&1) &
  pid=$!
  wait_for_step "$run" 5
  if [ "$how" = usr1-mpirun ]; then
    kill -USR1 "$pid"
  else
    pkill -TERM -f "^bin/yuanlm train .*--run.dir=$run"  # the ranks, not mpirun: what srun delivers
  fi
  set +e
  wait "$pid"
  rc=$?
  set -e
  cat "$WORK/$how.log" | tail -5
  [ "$rc" -eq 75 ] || { echo "expected exit 75, got $rc"; exit 1; }
  step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\).*/\1/p' "$WORK/$how.log")
  [ -n "$step" ] && [ -d "$run/ckpt/step_$(printf %07d "$step")" ] || { echo "no checkpoint for step $step"; exit 1; }
  train 2 "$run" "${args[@]}" --train.steps=$((step + 3)) >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  grep "resumed from $run/ckpt/step_$(printf %07d "$step"): step $step" "$WORK/log"
  grep -q "done: 3 steps" "$WORK/log"
done
