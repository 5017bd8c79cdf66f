# One GPU against the CPU reference on the demo corpus: the tiny deck for 150 steps on one rank, once with
# train.device=cuda (bf16 weights and activations, fp32 gradients and optimizer) and once with
# train.device=cpu (fp32 throughout). Same data order, same initial weights, so the two loss curves must
# agree to bf16 accuracy: every logged step within 3% relative, the mean gap under 1%, the final validation
# loss within 2%, and both curves must fall. Skipped (77) without CUDA in the build or without a GPU.
source "$(dirname "$0")/lib.sh"
bin/yuanlm --version | grep -q cuda || { echo "SKIP: built without the CUDA backend"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU (nvidia-smi -L fails)"; exit 77; }
tools/demo.sh --prep-only
args=(input/tiny.ini --train.global_batch=8 --train.steps=150 --train.log_every=1 --train.eval_every=150)
for dev in cpu cuda; do
  mpirun -np 1 bin/yuanlm train "${args[@]}" --train.device=$dev --run.dir="$WORK/$dev" >"$WORK/$dev.log" 2>&1 ||
    { cat "$WORK/$dev.log"; exit 1; }
done
grep -q "backend cuda" "$WORK/cuda.log"
$PY - "$WORK/cpu/metrics.jsonl" "$WORK/cuda/metrics.jsonl" <<'PYEOF'
import json, sys
def read(path):
    rows = [json.loads(l) for l in open(path)]
    return [r["loss"] for r in rows if "loss" in r], [r["val_loss"] for r in rows if "val_loss" in r]
(cpu, cpu_val), (gpu, gpu_val) = read(sys.argv[1]), read(sys.argv[2])
assert len(cpu) == len(gpu) == 150, (len(cpu), len(gpu))
gaps = [abs(g - c) / c for c, g in zip(cpu, gpu)]
worst = max(range(len(gaps)), key=gaps.__getitem__)
print(f"cpu {cpu[0]:.4f} -> {cpu[-1]:.4f}, gpu {gpu[0]:.4f} -> {gpu[-1]:.4f}; mean gap {sum(gaps) / len(gaps):.4f}, "
      f"worst {gaps[worst]:.4f} at step {worst + 1}; val cpu {cpu_val[-1]:.4f} gpu {gpu_val[-1]:.4f}")
assert gaps[worst] <= 0.03, "a step's loss differs by more than 3%"
assert sum(gaps) / len(gaps) <= 0.01, "the curves differ by more than 1% on average"
assert abs(gpu_val[-1] - cpu_val[-1]) / cpu_val[-1] <= 0.02, "final validation losses differ by more than 2%"
for name, curve in (("cpu", cpu), ("gpu", gpu)):
    assert sum(curve[-10:]) / 10 < sum(curve[:10]) / 10 - 1.0, f"the {name} run does not learn"
PYEOF
