# A run SIGKILLed in the middle of a step, then started again with the same command, continues from its newest
# checkpoint and ends bit-identical to a run that was never interrupted. A corrupt newest checkpoint is
# reported by name and skipped for the one before it, with the same result.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=24 --train.global_batch=8 --train.micro_batch=2 --ckpt.every=5 --data.val="$WORK/corpus/*.h5"
      --train.eval_every=5 --train.eval_batches=1)
train 2 "$WORK/ref" "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

for kill_at in 7 13; do
  run="$WORK/killed$kill_at"
  echo "== SIGKILL at step $kill_at"
  set +e
  YUANLM_KILL_AT=$kill_at timeout 60 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" >"$WORK/log" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$WORK/log"; echo "expected the killed run to fail, got $rc"; exit 1; }
  train 2 "$run" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  grep "resumed from $run/ckpt/step_$(printf %07d $((kill_at / 5 * 5)))" "$WORK/log"
  compare "$WORK/ref" "$run" 0 0
done

echo "== corrupt newest checkpoint"
run="$WORK/corrupt"
set +e
YUANLM_KILL_AT=17 timeout 60 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" >/dev/null 2>&1
set -e
shard="$run/ckpt/step_0000015/optim_00001_000.safetensors"  # rank 1, the module group from module 0
truncate -s 100 "$shard"
train 2 "$run" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep "skipping checkpoint $run/ckpt/step_0000015: $shard" "$WORK/log"
grep "resumed from $run/ckpt/step_0000010" "$WORK/log"
compare "$WORK/ref" "$run" 0 0
