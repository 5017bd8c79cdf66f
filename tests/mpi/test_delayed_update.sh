# optim.delayed_update through the trainer with the real CPU backend on 2 ranks: it trains (the loss falls like
# the plain update's), it is not the plain update (weights one step stale), and checkpoints and evaluations
# in the middle drain the update in flight, so a run that saves every 5 steps ends with the same weights as
# the same run resumed from its step-10 checkpoint. The exact recurrence is checked in tests/test_mpi_zero.cpp.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=20 --train.global_batch=8 --train.micro_batch=2 --optim.zero=2 --optim.bucket_mb=0.01)
train 2 "$WORK/plain" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
train 2 "$WORK/delayed" "${args[@]}" --optim.delayed_update=true --ckpt.every=5 >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; exit 1; }
grep -q "with a one-step delayed update" "$WORK/log"
$PY - "$WORK/plain/metrics.jsonl" "$WORK/delayed/metrics.jsonl" <<'PYEOF'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r]
plain, delayed = losses(sys.argv[1]), losses(sys.argv[2])
assert len(plain) == len(delayed) == 20, (len(plain), len(delayed))
assert delayed[0] == plain[0], "step 1 runs on the initial weights in both"
assert max(abs(a - b) for a, b in zip(plain[2:], delayed[2:])) > 1e-6, "delayed run is the plain update"
first, last = sum(delayed[:3]) / 3, sum(delayed[-3:]) / 3
assert last < first - 0.2, f"delayed update does not train: {first:.3f} -> {last:.3f}"
print(f"plain {plain[0]:.3f} -> {plain[-1]:.3f}, delayed {delayed[0]:.3f} -> {delayed[-1]:.3f}")
PYEOF
# Killed at step 12 and resumed from the step-10 checkpoint: that checkpoint holds the drained state, so the
# resumed run repeats the uninterrupted one exactly.
run="$WORK/killed"
set +e
YUANLM_KILL_AT=12 timeout 60 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" --optim.delayed_update=true --ckpt.every=5 \
  >/dev/null 2>&1
set -e
train 2 "$run" "${args[@]}" --optim.delayed_update=true --ckpt.every=5 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "resumed from $run/ckpt/step_0000010" "$WORK/log"
compare "$WORK/delayed" "$run" 0 0
