# The optimizer's two placements on the cuda backend (bin/yuanlm_emu, the emulator): optim.offload = none (fp32
# master weights and moments on the device, the backend's adamw op reading the reduced gradient where the backend
# holds it) against optim.offload = host (today's ZeRO-Offload), the tiny deck on 2 ranks, 10 steps, in the layouts
# where the two differ: ZeRO 0, 1 and 2 with buckets small enough that gradients are reduced in several, the
# delayed update, 2 tensor ranks, a pipeline of 2 stages, and ZeRO 3 with 2 micro-batches a step (each module's
# reduced piece accumulated into the device gradient shard), with and without the delayed update. Then runs
# checkpointed in one placement and resumed in the other, both ways, at ZeRO 1 and at ZeRO 3 (and on another
# number of ranks); optim.offload = auto choosing each placement on an emulated device that holds the state and
# on one that does not (YUAN_EMU_DEVICE_MB), and none at ZeRO 3; and the refusals of none where it cannot run.
#
# Tolerance: 1e-3 relative on every step's loss, and on the final weights against their largest value; 4e-3 on
# every step's gradient norm, which the bf16 flips below move most (measured: up to 5e-4). Both placements run AdamW in fp32 with the same formula (ops/adamw.h) on the same reduced gradients; they
# differ only in the order of a few fused operations per element (the GPU kernel against the OpenMP loop), about
# one fp32 rounding (6e-8) of a weight per step, which can flip the bf16 rounding of a working weight now and then:
# measured over 10 steps, loss gaps ~1e-5. A wrong update is far outside: the delayed update done at once instead
# moves the last loss by 2.5%, weight decay on the biases or a missed clipping by more.
source "$(dirname "$0")/lib.sh"
[ -x bin/yuanlm_emu ] || { echo "SKIP: bin/yuanlm_emu is not built (make emu)"; exit 77; }
make_corpus "$WORK/corpus" 2 4000 64
base=(--train.device=cuda --train.steps=10 --train.global_batch=8 --train.log_every=1 --data.val=)

# run NAME ARGS...: 2 ranks (NP, when set) of the tiny deck on the emulator into $WORK/NAME; its log must name the
# placement PLACE ARGS ask for ("host" or "device"). The emulator runs its streams in the order YUAN_EMU_STREAMS
# names, when set.
run() {
  local name=$1
  shift
  mpirun -np "${NP:-2}" ${YUAN_EMU_STREAMS:+-x YUAN_EMU_STREAMS} bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; exit 1; }
  if grep -q "cuda emulator:" "$WORK/$name.log"; then grep "cuda emulator:" "$WORK/$name.log"; exit 1; fi
}
placed() {
  grep -q "optimizer on the $2 " "$WORK/$1.log" || { grep "optimizer on" "$WORK/$1.log"; echo "$1: not on the $2"; exit 1; }
}
# same A B: losses and final weights (compare_runs.py) within 1e-3, every step's gradient norm within 4e-3.
same() {
  compare "$WORK/$1" "$WORK/$2" 1e-3 1e-3
  $PY - "$WORK/$1/metrics.jsonl" "$WORK/$2/metrics.jsonl" <<'PYEOF'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
gaps = [abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"] for x, y in zip(a, b)]
print(f"grad_norm: worst relative difference {max(gaps):.2e} (tolerance 4e-3)")
assert len(a) == len(b) and max(gaps) <= 4e-3, "the gradient norms differ"
PYEOF
}

zero0=(--optim.zero=0 --optim.bucket_mb=0.01)
zero1=(--optim.zero=1 --optim.bucket_mb=0.01)
zero2=(--optim.zero=2 --optim.bucket_mb=0.01)
delayed=(--optim.zero=1 --optim.delayed_update=true)
tp=(--train.micro_batch=2 --parallel.tp_size=2)
pipeline=(--train.micro_batch=2 "--parallel.template=p: wte, wpe, h.0 | h.1, ln_f" --parallel.pipelines=p
          --parallel.microbatches=p:4)
zero3=(--optim.zero=3 --train.micro_batch=2)
zero3delayed=(--optim.zero=3 --train.micro_batch=2 --optim.delayed_update=true)
# At ZeRO 3 the device's accumulation reads what the NCCL stream reduced. The emulator's default order runs an NCCL
# operation at its enqueue, so a missing wait there would go unseen; its earliest order runs the accumulation at
# its enqueue too, before a peer's late part has arrived. Without the wait (accumulated before compute_after),
# 4 runs of 4 failed here: losses 0.5% from host's by step 5, or the weights beyond 1e-3.
for layout in zero0 zero1 zero2 delayed tp pipeline zero3 zero3delayed; do
  echo "== $layout"
  declare -n extra=$layout
  streams=default
  [[ $layout == zero3* ]] && streams=earliest
  run "$layout-host" "${extra[@]}" --optim.offload=host
  YUAN_EMU_STREAMS=$streams run "$layout-none" "${extra[@]}" --optim.offload=none
  placed "$layout-host" host
  placed "$layout-none" device
  same "$layout-host" "$layout-none"
done

echo "== the host placement's split in metrics.jsonl"
# Rank 0's bytes each way (its shard: the whole model at zero 0, the first half at zero 1; fp32 down, bf16 up),
# the waits adding up to what was exposed; the delayed update's first step uploads nothing (it lands a step
# later) and keeps its AdamW off the critical path; no split where nothing crosses.
$PY - "$WORK" <<'PYEOF'
import json, re, sys
w = sys.argv[1]
n = int(re.search(r"model: (\d+) parameters", open(f"{w}/zero1-host.log").read()).group(1))
recs = lambda name: [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl") if '"loss"' in l]
for name, shard in (("zero0-host", n), ("zero1-host", (n + 1) // 2), ("delayed-host", (n + 1) // 2)):
    for i, r in enumerate(recs(name)):
        o = r["offload"]
        up = 0 if name == "delayed-host" and i == 0 else 2 * shard
        assert (o["down_bytes"], o["up_bytes"]) == (4 * shard, up), (name, r["step"], o)
        parts = o["grads_wait_s"] + o["adamw_s"] + o["weights_wait_s"]
        assert min(o.values()) >= 0 and abs(o["exposed_s"] - parts) < 1e-9, (name, r["step"], o)
        assert (o["adamw_s"] == 0) == (name == "delayed-host"), (name, r["step"], o)
for name in ("zero0-none", "zero1-none", "delayed-none"):
    assert all("offload" not in r for r in recs(name)), name
print(f"split: {n} parameters; bytes down and up as the shards say, on the host placement only")
PYEOF

echo "== resumed in the other placement"
# Killed at step 7 in one placement, resumed from its step-5 checkpoint in the other: the same numbers as the
# other placement's uninterrupted run. At ZeRO 3 the checkpoint's shards are the modules' pieces, in the same
# files from either placement.
for layout in zero1 zero3; do
  declare -n extra=$layout
  for pair in host:none none:host; do
    first=${pair%:*} second=${pair#*:} name=resume-$layout-${pair/:/-}
    YUANLM_KILL_AT=7 timeout 120 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" \
      "${extra[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/$name" --optim.offload="$first" \
      --ckpt.every=5 >"$WORK/$name-killed.log" 2>&1 && { cat "$WORK/$name-killed.log"; echo "not killed"; exit 1; }
    run "$name" "${extra[@]}" --optim.offload="$second" --ckpt.every=5
    placed "$name" "$([ "$second" = none ] && echo device || echo host)"
    grep -q "resumed from $WORK/$name/ckpt/step_0000005: step 5" "$WORK/$name.log" || { cat "$WORK/$name.log"; exit 1; }
    same "$layout-$second" "$name"
  done
done
# Across rank counts too: killed at ZeRO 3 on 2 ranks with the state on the host, resumed on 1 with it on the
# device (the shards re-cut), the same numbers as the 2-rank run on the device.
name=resume-zero3-ranks
YUANLM_KILL_AT=7 timeout 120 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" \
  "${zero3[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/$name" --optim.offload=host \
  --ckpt.every=5 >"$WORK/$name-killed.log" 2>&1 && { cat "$WORK/$name-killed.log"; echo "not killed"; exit 1; }
NP=1 run "$name" "${zero3[@]}" --optim.offload=none --ckpt.every=5
placed "$name" device
grep -q "resumed from $WORK/$name/ckpt/step_0000005: step 5, written by 2 ranks, optimizer state re-cut for 1" \
  "$WORK/$name.log" || { cat "$WORK/$name.log"; exit 1; }
same zero3-none "$name"

echo "== auto"
# A model whose optimizer state (12 bytes a parameter, 3.7M parameters) fits the default 16 GiB device, and an
# emulated device of 400 MiB that holds the run with the state on the host (0.37 GiB with the margin) but not on
# the device (0.41 GiB).
make_corpus "$WORK/corpus8k" 2 4000 8192
big=(--optim.zero=0 --model.n_embd=256 --model.vocab_size=8192 --train.steps=2 --data.train="$WORK/corpus8k/*.h5")
mpirun -np 1 bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" "${big[@]}" --run.dir="$WORK/auto-fits" \
  >"$WORK/auto-fits.log" 2>&1 || { cat "$WORK/auto-fits.log"; exit 1; }
grep -q "optimizer on the device (optim.offload = auto: the state fits on the device" "$WORK/auto-fits.log" ||
  { grep "optimizer on" "$WORK/auto-fits.log"; exit 1; }
YUAN_EMU_DEVICE_MB=400 mpirun -np 1 bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" "${big[@]}" \
  --run.dir="$WORK/auto-host" >"$WORK/auto-host.log" 2>&1 || { cat "$WORK/auto-host.log"; exit 1; }
grep -q "optimizer on the host (optim.offload = auto: the device would not hold it: .*optimizer 0.04" \
  "$WORK/auto-host.log" || { grep "optimizer on" "$WORK/auto-host.log"; exit 1; }
# Asked for, none on that device is the memory check's refusal, with the optimizer among the parts.
if YUAN_EMU_DEVICE_MB=400 mpirun -np 1 bin/yuanlm_emu train "${TINY[@]}" "${base[@]}" "${big[@]}" \
  --optim.offload=none --run.dir="$WORK/none-short" >"$WORK/none-short.log" 2>&1; then
  echo "optim.offload = none ran on a device that cannot hold it"; exit 1
fi
grep -q "^error: .*memory: .*device memory (.*optimizer 0.04" "$WORK/none-short.log" || { cat "$WORK/none-short.log"; exit 1; }
# At ZeRO 3 as at the other stages: on the device where it fits, the same run as none asked for.
run auto-zero3 "${zero3[@]}"
grep -q "optimizer on the device (optim.offload = auto: the state fits on the device" "$WORK/auto-zero3.log" ||
  { grep "optimizer on" "$WORK/auto-zero3.log"; exit 1; }
same zero3-none auto-zero3
echo "auto: on the device where it fits, on the host where it does not, at ZeRO 3 too"

echo "== refusals"
expect_error() {  # expect_error WANT ARGS...: a 1-rank run of ARGS fails with one error line containing WANT
  local want=$1
  shift
  if mpirun -np 1 "$@" >"$WORK/refused.log" 2>&1; then cat "$WORK/refused.log"; exit 1; fi
  grep '^error:' "$WORK/refused.log" | grep -qF "$want" || { cat "$WORK/refused.log"; exit 1; }
}
expect_error "optim.offload = none: the cpu backend keeps the optimizer in host memory" bin/yuanlm train \
  "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/cpu-none" --optim.offload=none
expect_error "optim.offload = none: the cpu backend keeps the optimizer in host memory" bin/yuanlm train \
  "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/cpu-z3-none" --optim.zero=3 --optim.offload=none
expect_error "optim.offload must be auto, host or none (got 'gpu')" bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/bad" --optim.offload=gpu
echo "refused: none on the cpu backend (at ZeRO 3 too), an unknown placement"
