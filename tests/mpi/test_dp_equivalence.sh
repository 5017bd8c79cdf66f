# Data parallelism changes nothing but speed: 10 steps with global batch 12 on 1 rank equal the same steps on
# 2, 3 and 4 ranks, with and without gradient accumulation (ZeRO stage 1, the default).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
common=(--train.steps=10 --train.global_batch=12)
train 1 "$WORK/ref" "${common[@]}" --train.micro_batch=12
for spec in "1 4" "2 6" "2 3" "3 4" "3 2" "4 3" "4 1"; do
  read -r np micro <<<"$spec"
  echo "== $np ranks, micro-batch $micro"
  train "$np" "$WORK/r$np-$micro" "${common[@]}" --train.micro_batch="$micro" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log"; exit 1; }
  compare "$WORK/ref" "$WORK/r$np-$micro" 1e-5 1e-5
done
