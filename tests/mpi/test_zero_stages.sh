# ZeRO stages 0, 1 and 2 are the same optimizer: equal losses and weights on 2 and 3 ranks, with accumulation.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
common=(--train.steps=10 --train.global_batch=12)
for np in 2 3; do
  micro=$((12 / np / 2))
  for z in 0 1 2; do
    train "$np" "$WORK/z$z-$np" "${common[@]}" --train.micro_batch="$micro" --optim.zero=$z --optim.bucket_mb=0.01 \
      >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  done
  compare "$WORK/z0-$np" "$WORK/z1-$np" 1e-5 1e-5
  compare "$WORK/z0-$np" "$WORK/z2-$np" 1e-5 1e-5
done
