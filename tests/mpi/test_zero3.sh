# ZeRO-3 (the working weights sharded too, each module gathered where a pass uses it) is the same optimizer as
# ZeRO-2: equal losses, validation losses and weights on 2, 3 and 4 ranks, with accumulation, with recompute
# (backward gathers each block again for its second forward), with the delayed update; its checkpoints (one
# piece per module) resume at another stage and another world size, and the other stages' resume at ZeRO-3.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
common=(--train.steps=10 --train.global_batch=12 --data.val="$WORK/corpus/*.h5" --train.eval_every=5
        --train.eval_batches=2)
i=0
same() {  # NP TOLERANCE ARGS...: ZeRO 2 and ZeRO 3 runs of ARGS on NP ranks
  local np=$1 tol=$2
  shift 2
  i=$((i + 1))
  echo "== $np ranks: $*"
  for z in 2 3; do
    train "$np" "$WORK/z$z-$i" "${common[@]}" --optim.zero=$z "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  done
  grep -q "ZeRO stage 3, backend cpu, .*; modules gathered on a communication thread" "$WORK/log"
  compare "$WORK/z2-$i" "$WORK/z3-$i" "$tol" "$tol"
  $PY - "$WORK/z2-$i/metrics.jsonl" "$WORK/z3-$i/metrics.jsonl" "$tol" <<'PYEOF'
import json, sys
val = [[r["val_loss"] for r in map(json.loads, open(p)) if "val_loss" in r] for p in sys.argv[1:3]]
assert len(val[0]) == len(val[1]) == 3, val
worst = max(abs(a - b) / abs(a) for a, b in zip(*val))
assert worst <= float(sys.argv[3]), f"val losses differ: {val}"
print(f"val losses: {len(val[0])} evaluations, worst relative difference {worst:.2e}")
PYEOF
}
# Two ranks add two numbers, in either order the same: bit for bit.
same 2 0 --train.micro_batch=3
same 3 1e-5 --train.micro_batch=2
same 4 1e-5 --train.micro_batch=1 --train.recompute=true
same 2 0 --train.micro_batch=2 --optim.delayed_update=true

echo "== ZeRO 3 on 3 ranks killed at step 12, resumed at ZeRO 1 on 2 ranks; ZeRO 1 on 2 resumed at ZeRO 3 on 4"
args=(--train.steps=20 --train.global_batch=12 --train.micro_batch=1 --ckpt.every=5)
train 2 "$WORK/ref" "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
for spec in "3 3 2 1" "2 1 4 3"; do
  read -r np1 z1 np2 z2 <<<"$spec"
  run="$WORK/r$np1-$np2"
  set +e
  YUANLM_KILL_AT=12 timeout 60 mpirun -x YUANLM_KILL_AT -np "$np1" bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" --optim.zero="$z1" >/dev/null 2>&1
  set -e
  train "$np2" "$run" "${args[@]}" --optim.zero="$z2" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  grep "resumed from $run/ckpt/step_0000010: step 10, written by $np1 ranks" "$WORK/log"
  compare "$WORK/ref" "$run" 1e-5 1e-5
done
