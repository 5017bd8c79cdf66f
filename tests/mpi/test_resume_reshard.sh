# Resuming on a different number of ranks re-cuts the optimizer shards and continues: 2 -> 3 and 3 -> 1 ranks
# match an uninterrupted run within floating-point tolerance (the reduction order changes with the ranks).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=20 --train.global_batch=12 --ckpt.every=5)
train 2 "$WORK/ref" "${args[@]}" --train.micro_batch=6 >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
for spec in "2 6 3 2" "3 4 1 12"; do
  read -r np1 mb1 np2 mb2 <<<"$spec"
  run="$WORK/r$np1-$np2"
  echo "== $np1 ranks, killed at step 12, resumed on $np2 ranks"
  set +e
  YUANLM_KILL_AT=12 timeout 60 mpirun -x YUANLM_KILL_AT -np "$np1" bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" --train.micro_batch="$mb1" >/dev/null 2>&1
  set -e
  train "$np2" "$run" "${args[@]}" --train.micro_batch="$mb2" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  grep "resumed from $run/ckpt/step_0000010: step 10, written by $np1 ranks, optimizer state re-cut for $np2" "$WORK/log"
  compare "$WORK/ref" "$run" 1e-5 1e-5
done
