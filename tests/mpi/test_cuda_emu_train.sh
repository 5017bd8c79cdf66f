# The CUDA backend on the emulator (bin/yuanlm_emu, cuda/emu) trains like the CPU backend: the tiny deck on 2
# ranks for 20 steps with train.device=cuda (kernels, cuBLASLt GEMMs, NCCL reductions over MPI, ZeRO-2 buckets
# reduced while backward runs) and with train.device=cpu, same data order and initial weights.
#
# Tolerance: every step's loss within 1% and the mean gap within 2^-9 ~ 2e-3 relative; final weights within 1e-2
# of their scale. The CUDA backend keeps weights and activations in bf16 (a relative rounding of up to 2^-9 each)
# where the CPU backend keeps fp32, and nothing else differs: the optimizer is the same fp32 host AdamW. A loss is
# a mean over 8 x 16 tokens, so its inputs' bf16 roundings mostly cancel (measured: ~1e-4), and AdamW moves each
# weight by at most lr per step whatever the gradient's rounding, so 20 steps at lr 3e-3 leave the weights within
# a few 1e-3 of each other. A wrong kernel, transpose or reduction moves the losses by far more than that.
source "$(dirname "$0")/lib.sh"
[ -x bin/yuanlm_emu ] || { echo "SKIP: bin/yuanlm_emu is not built (make emu)"; exit 77; }
make_corpus "$WORK/corpus" 2 4000 64
for dev in cpu cuda; do
  mpirun -np 2 bin/yuanlm_emu train "${TINY[@]}" --train.device=$dev --data.train="$WORK/corpus/*.h5" \
    --run.dir="$WORK/$dev" --train.steps=20 --train.global_batch=8 --train.log_every=1 --optim.zero=2 \
    --optim.bucket_mb=0.01 >"$WORK/$dev.log" 2>&1 || { cat "$WORK/$dev.log"; exit 1; }
done
grep -q "backend cuda" "$WORK/cuda.log"
if grep -q "cuda emulator:" "$WORK/cuda.log"; then
  grep "cuda emulator:" "$WORK/cuda.log"
  exit 1
fi
compare "$WORK/cpu" "$WORK/cuda" 1e-2 1e-2
$PY - "$WORK/cpu/metrics.jsonl" "$WORK/cuda/metrics.jsonl" <<'PYEOF'
import json, sys
cpu, gpu = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
gaps = [abs(g - c) / c for c, g in zip(cpu, gpu)]
print(f"mean relative loss gap {sum(gaps) / len(gaps):.2e} (tolerance {2 ** -9:.2e})")
assert len(gaps) == 20 and sum(gaps) / len(gaps) <= 2 ** -9, "the emulated CUDA backend drifts from the CPU backend"
assert gpu[-1] < gpu[0] - 0.3, "the emulated CUDA backend does not learn"
PYEOF
