# Signals at any time. The stop handlers are installed at the very start of main, before MPI starts:
#  early    SIGTERM to the ranks as soon as they catch it (during MPI's start-up, long before the first step):
#           exit 75 without writing a checkpoint, and the next start resumes from the last good one;
#  eval     an evaluation of 60000 micro-batches (some 20 s here): SIGTERM in train's first evaluation ends
#           it within a micro-batch (exit 75, no checkpoint: no step was done); so does SIGTERM to `yuanlm eval`;
#  sbatch   SIGTERM to jobs/train.sbatch with the mpirun launcher (what SLURM sends the batch shell at the time
#           limit): the ranks checkpoint and the job exits 75 (mpirun itself, given SIGTERM, kills them and exits 1).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
# A validation set that 60000 micro-batches of 4 windows on 2 ranks fit in: 2^23 random tokens (numpy, not
# make_corpus's loop, which would take seconds).
$PY - "$WORK/val.h5" <<'PYEOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(3).integers(0, 64, 1 << 23, dtype=np.uint16),
                     chunks=(65536,))
    f.attrs["format_version"] = 1
    f.attrs["vocab_size"] = 64
    f.attrs["eot_id"] = 0
    f.attrs["tokenizer"] = "synthetic:none"
PYEOF
run="$WORK/run"
args=(--train.global_batch=8 --train.micro_batch=4 --ckpt.every=0)
cleanup() {  # without the fix a rank may ignore SIGTERM for ever: take down what this test started
  local p
  for p in $(procs bin/yuanlm) $(procs mpirun); do kill -KILL "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
catches_term() {  # PID: SIGTERM (bit 15-1) is in the process's caught-signal mask
  local mask
  mask=$(awk '/^SigCgt/ { print $2 }' "/proc/$1/status" 2>/dev/null) && [ -n "$mask" ] && (((16#$mask >> 14) & 1))
}
# term_when_caught NP WHAT: once NP ranks run and catch SIGTERM, sends it to each of them (what srun delivers).
term_when_caught() {
  local p n ok
  for _ in $(seq 600); do
    n=0 ok=1
    for p in $(procs bin/yuanlm); do n=$((n + 1)); catches_term "$p" || ok=0; done
    if [ "$n" -eq "$1" ] && [ "$ok" = 1 ]; then
      for p in $(procs bin/yuanlm); do kill -TERM "$p"; done
      return 0
    fi
    sleep 0.02
  done
  echo "$2: the ranks never caught SIGTERM"; return 1
}
expect_75() {  # PID LOG WHAT
  local rc
  set +e
  wait "$1"
  rc=$?
  set -e
  echo "$3: exit $rc"
  grep -E "stopped|^error" "$2" || true
  [ "$rc" -eq 75 ] || { tail -5 "$2"; echo "$3: expected exit 75, got $rc"; exit 1; }
}

train 2 "$run" "${args[@]}" --train.steps=6 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }

echo "== early"
(exec timeout 60 mpirun -np 2 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$run" \
  "${args[@]}" --train.steps=100000 >"$WORK/early.log" 2>&1) &
job=$!
term_when_caught 2 early
expect_75 "$job" "$WORK/early.log" early
grep -q "stopped by a signal before the first step: nothing to save, no checkpoint written; exit 75" "$WORK/early.log"
[ "$(ls "$run/ckpt")" = "$(printf 'latest\nstep_0000006')" ] && [ "$(cat "$run/ckpt/latest")" = step_0000006 ] ||
  { ls "$run/ckpt"; echo "the checkpoints changed"; exit 1; }
train 2 "$run" "${args[@]}" --train.steps=8 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep "resumed from $run/ckpt/step_0000006: step 6" "$WORK/log"
grep -q "done: 2 steps" "$WORK/log"

echo "== eval"
(exec timeout 60 mpirun -np 2 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/eval" \
  "${args[@]}" --train.steps=100000 --data.val="$WORK/val.h5" --train.eval_batches=60000 \
  >"$WORK/eval.log" 2>&1) &
job=$!
for _ in $(seq 300); do grep -q "^host memory of rank 0" "$WORK/eval.log" && break; sleep 0.1; done
sleep 0.5  # into the evaluation
term_when_caught 2 "train's evaluation"
start=$SECONDS
expect_75 "$job" "$WORK/eval.log" "train's evaluation"
[ $((SECONDS - start)) -le 10 ] || { echo "the evaluation went on for $((SECONDS - start)) s after SIGTERM"; exit 1; }
grep -q "stopped by a signal before the first step" "$WORK/eval.log"
[ ! -e "$WORK/eval/ckpt" ] || { echo "a checkpoint was written with no step done"; exit 1; }

(exec timeout 60 mpirun -np 2 bin/yuanlm eval --checkpoint "$run" --data "$WORK/val.h5" --batches 60000 \
  >"$WORK/yeval.log" 2>&1) &
job=$!
term_when_caught 2 "yuanlm eval"
start=$SECONDS
expect_75 "$job" "$WORK/yeval.log" "yuanlm eval"
[ $((SECONDS - start)) -le 10 ] || { echo "yuanlm eval went on for $((SECONDS - start)) s after SIGTERM"; exit 1; }
grep -Eq "eval: stopped by SIGTERM after [0-9]+ of 60000 micro-batches: no result; exit 75" "$WORK/yeval.log"

echo "== sbatch"
(exec env NP=2 LAUNCHER=mpirun YUANLM_HOME="$PWD" bash jobs/train.sbatch input/tiny.ini "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --data.val="$WORK/corpus/shard_001.h5" --train.eval_batches=1 \
  --run.dir="$WORK/sbatch" "${args[@]}" --train.steps=100000 >"$WORK/sbatch.log" 2>&1) &
job=$!
for _ in $(seq 300); do
  [ -f "$WORK/sbatch/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$WORK/sbatch/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -TERM "$job"
expect_75 "$job" "$WORK/sbatch.log" sbatch
step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\).*/\1/p' "$WORK/sbatch.log")
[ -n "$step" ] && [ -d "$WORK/sbatch/ckpt/step_$(printf %07d "$step")" ] ||
  { echo "no checkpoint for step $step"; exit 1; }
