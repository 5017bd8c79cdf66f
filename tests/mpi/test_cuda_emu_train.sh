# The CUDA backend on the emulator (bin/yuanlm_emu, cuda/emu) trains like the CPU backend: the tiny deck with
# train.device=cuda and with train.device=cpu, same data order and initial weights, in five layouts, the first four
# on both attention paths (model.attention = own, this project's kernels, and auto, which takes cuDNN's fused
# attention through the emulated cuDNN of cuda/emu/cudnn.cpp where the build has the cuDNN frontend):
#   data:     2 data-parallel ranks for 20 steps, ZeRO-2 with small buckets, so that gradients are reduced over NCCL
#             (emulated over MPI) bucket by bucket while backward still runs;
#   pipeline: one pipeline of 2 stages for 10 steps, 4 micro-batches under 1F1B, so that activations and their
#             gradients travel by NCCL send/receive and the tied wte is summed across the stages;
#   zero3:    2 data-parallel ranks for 20 steps at ZeRO-3, so that every module is gathered into device buffers
#             over NCCL, the next one prefetched on the NCCL stream while the current one computes, and its
#             gradient reduce-scattered and copied out on the copy stream (the emulator's lazy streams make any
#             missing wait between them give wrong weights);
#   tp:       2 tensor-parallel ranks (Megatron's cut) for 20 steps, 4 micro-batches a step, so that the vocabulary-
#             parallel embedding and cross-entropy, the column- and row-parallel layers and their all-reduces over
#             NCCL, and the bias and residual added after them all run on the cuda backend;
#   tp4:      4 tensor ranks (4 heads) for 6 steps, resumed from a checkpoint whose every logit is raised by 40
#             (each wte row gains the vector of ones and ln_f's bias 40/n_embd on every feature: the softmax does
#             not see a shift that is the same for a whole row, and its gradient has none, so it stays), as a
#             trained model's logits are large: the ranks' row maxima are all-reduced with MAX over NCCL, and a
#             wrong operator (their sum, ~4 x 40) underflows every exp(z - max) and the loss is NaN, where tp 2 at
#             initial logits (near 0) gives the same numbers with either operator (both checked by planting it).
#
# Tolerance: every step's loss within 1% and the mean gap within 2^-9 ~ 2e-3 relative; final weights within 1e-2
# of their scale. The CUDA backend keeps weights and activations in bf16 (a relative rounding of up to 2^-9 each)
# where the CPU backend keeps fp32, and nothing else differs: the optimizer is fp32 AdamW on both (on the
# emulated device there, optim.offload = auto; tests/mpi/test_offload_placement.sh holds it to the host's). A loss is
# a mean over 8 x 16 tokens, so its inputs' bf16 roundings mostly cancel (measured: ~1e-4), and AdamW moves each
# weight by at most lr per step whatever the gradient's rounding, so 20 steps at lr 3e-3 leave the weights within
# a few 1e-3 of each other. A wrong kernel, transpose or reduction moves the losses by far more than that.
# The gradient norm (before clipping) is compared too, since AdamW hides a wrong gradient scale from the losses and
# weights: in units of bf16's rounding u = 2^-9, step 1 within u (the same weights and batch on both backends, so
# only the bf16 storage of activations and weights differs: each gradient element is off by a few u at most, with
# random signs, and the norm averages them; measured ~3e-5), every later step within 8u = 2^-6 (the runs' weights
# have drifted apart by then, as above; measured up to 6e-3) and their mean within 2u = 2^-8 (measured ~1e-3).
# tp4's logits near 40 are stored in bf16 on the cuda backend with a rounding of up to 2^5 u-2^6 u each (near 0:
# ~u of a far smaller value), which moves its losses and gradients ~16 times as far (measured over its 6 steps:
# loss gaps up to 2.5e-3, their mean 1.2e-3; grad_norm 1.5% at step 1 and at worst, 0.7% on average; weights
# 8e-3; over 10 steps grad_norm reached 6%): there every tolerance in units of u is 16 times the above, and the
# weights are held to 2e-2. A wrong maximum is a NaN loss, which ends the run.
# Every run of every layout is also held to the emulator's checks, the stream happens-before rule among them
# (docs/EMULATOR.md): a copy, kernel or NCCL operation not ordered by an event wait or synchronisation after the
# work whose memory it touches is a report whatever the timing, and any report fails the layout (run, below).
source "$(dirname "$0")/lib.sh"
[ -x bin/yuanlm_emu ] || { echo "SKIP: bin/yuanlm_emu is not built (make emu)"; exit 77; }
make_corpus "$WORK/corpus" 2 4000 64
data=(--train.steps=20 --optim.zero=2 --optim.bucket_mb=0.01)
pipeline=(--train.steps=10 --train.micro_batch=2 "--parallel.template=p: wte, wpe, h.0 | h.1, ln_f"
          --parallel.pipelines=p --parallel.microbatches=p:4)
zero3=(--train.steps=20 --train.micro_batch=2 --optim.zero=3)
tp=(--train.steps=20 --train.micro_batch=2 --parallel.tp_size=2)

echo "== a shape the cuda ops cannot run"
# The ops' constraints (TensorFormats: rows of whole 8-element vectors) are checked where the model meets the
# backend, in each rank's plan: every rank stops with the one line before a backend is made.
if mpirun -np 2 bin/yuanlm_emu train "${TINY[@]}" --train.device=cuda --model.n_embd=36 \
    --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/shape" >"$WORK/shape.log" 2>&1; then
  cat "$WORK/shape.log"; echo "a model of n_embd 36 ran on the cuda backend"; exit 1
fi
want="cuda backend: n_embd = 36 must be a multiple of 8 (16-byte bf16 vectors)"
grep '^error:' "$WORK/shape.log" | grep -qF "$want" || { cat "$WORK/shape.log"; exit 1; }
if grep -q "^cuda: device" "$WORK/shape.log"; then echo "the backend was made before the shape was refused"; exit 1; fi
# compare_metrics CPU_RUN CUDA_RUN K MIN_STEPS DROP: the two runs' metrics.jsonl: losses and gradient norms in units
# of K times bf16's rounding u, at least MIN_STEPS steps, the loss down by DROP; then the same with the planted bug
# the norm comparison is for.
compare_metrics() {
  $PY - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "$4" "$5" <<'PYEOF'
import json, sys
cpu, gpu = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
k, min_steps, drop = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
u = k * 2 ** -9  # bf16's unit roundoff, times the layout's factor
def check(gpu, say=print):
    def gaps(key):
        return [abs(g[key] - c[key]) / c[key] for c, g in zip(cpu, gpu)]
    loss = gaps("loss")
    say(f"mean relative loss gap {sum(loss) / len(loss):.2e} (tolerance {u:.2e})")
    assert len(loss) == len(cpu) == len(gpu) >= min_steps and sum(loss) / len(loss) <= u, \
        "the emulated CUDA backend drifts from the CPU backend"
    assert gpu[-1]["loss"] < gpu[0]["loss"] - drop, "the emulated CUDA backend does not learn"
    norm = gaps("grad_norm")
    say(f"relative grad_norm gap: step 1 {norm[0]:.2e} (tolerance {u:.2e}), worst {max(norm):.2e} "
        f"(tolerance {8 * u:.2e}), mean {sum(norm) / len(norm):.2e} (tolerance {2 * u:.2e})")
    assert norm[0] <= u and max(norm) <= 8 * u and sum(norm) / len(norm) <= 2 * u, \
        f"the gradient norms differ: {[c['grad_norm'] for c in cpu]} vs {[g['grad_norm'] for g in gpu]}"
check(gpu)
# The planted bug this comparison is for: a gradient 22% too large everywhere (as a wrong scale in a backward
# kernel gives), which the losses do not show; the grad_norm comparison must fail on it.
try:
    check([dict(g, grad_norm=1.22 * g["grad_norm"]) for g in gpu], say=lambda _: None)
except AssertionError as e:
    assert str(e).startswith("the gradient norms differ"), e
    print("a gradient norm 22% too large is caught")
else:
    sys.exit("a gradient norm 22% too large passed the comparison")
PYEOF
}

# run NAME NP DEVICE ARGS...: the layout on one backend into $WORK/NAME, with no emulator report.
run() {
  local name=$1 np=$2 dev=$3
  shift 3
  mpirun -np "$np" bin/yuanlm_emu train "${TINY[@]}" --train.device=$dev --data.train="$WORK/corpus/*.h5" \
    --run.dir="$WORK/$name" --train.global_batch=8 --train.log_every=1 "$@" \
    >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
  if grep -q "cuda emulator:" "$WORK/$name.log"; then
    grep "cuda emulator:" "$WORK/$name.log"
    exit 1
  fi
}
# run_layout NAME NP ARGS...: the layout on both backends, NAME-cpu and NAME-cuda.
run_layout() {
  run "$1-cpu" "$2" cpu "${@:3}"
  run "$1-cuda" "$2" cuda "${@:3}"
  grep -q "backend cuda" "$WORK/$1-cuda.log"
}

# The attention paths this build has: own always, cudnn where the emulated cuDNN is built in (auto takes it).
paths=(own)
run probe 1 cuda --train.steps=1 --train.micro_batch=8
if grep -q "^attention: cudnn" "$WORK/probe.log"; then
  paths+=(cudnn)
else
  echo "note: this build has no cuDNN, only own attention is compared: $(grep '^attention:' "$WORK/probe.log")"
fi

for layout in data pipeline zero3 tp; do
  declare -n extra=$layout
  run "$layout-cpu" 2 cpu "${extra[@]}"
  for path in "${paths[@]}"; do
    echo "== $layout, $path attention"
    run "$layout-$path" 2 cuda --model.attention=$path "${extra[@]}"
    grep -q "^attention: $path" "$WORK/$layout-$path.log" || { grep "^attention" "$WORK/$layout-$path.log"; exit 1; }
    compare "$WORK/$layout-cpu" "$WORK/$layout-$path" 1e-2 1e-2
    compare_metrics "$WORK/$layout-cpu" "$WORK/$layout-$path" 1 10 0.2
  done
done

echo "== tp4"
train 1 "$WORK/tp4-init" --model.n_head=4 --train.steps=1 --train.global_batch=8 --train.micro_batch=2 >/dev/null
ckpt="$WORK/tp4-init/ckpt/step_0000001"
$PY - "$ckpt" 64 32 40 <<'PYEOF'
# Raise every logit by `shift` in a one-rank checkpoint of vocabulary V and width C, and seal it again.
import hashlib, json, sys
import numpy as np
d, V, C, shift = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
state = json.load(open(f"{d}/state.json"))
(entry,) = [f for f in state["files"] if f["name"].startswith("optim_")]
assert entry["offset"] == 0 and entry["count"] == state["n_params"], "one shard of the whole model"
path = f"{d}/{entry['name']}"
raw = bytearray(open(path, "rb").read())
n = int.from_bytes(raw[:8], "little")
b, e = json.loads(raw[8:8 + n])["master"]["data_offsets"]
w = np.frombuffer(raw, dtype="<f4", count=(e - b) // 4, offset=8 + n + b).copy()
w[:V * C] += 1.0  # wte, first in the layout: every row gains the vector of ones
w[-C:] += shift / C  # ln_f's bias, last: shift / C on every feature, so each logit rises by shift
raw[8 + n + b:8 + n + e] = w.astype("<f4").tobytes()
open(path, "wb").write(raw)
entry["sha256"] = hashlib.sha256(raw).hexdigest()
del state["sha256"]  # state.json's own checksum: of its JSON without it, keys sorted, no whitespace
state["sha256"] = hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
json.dump(state, open(f"{d}/state.json", "w"), indent=2)
PYEOF
run_layout tp4 4 --model.n_head=4 --parallel.tp_size=4 --train.micro_batch=2 --train.steps=7 --ckpt.resume="$ckpt"
compare "$WORK/tp4-cpu" "$WORK/tp4-cuda" 1e-2 2e-2
compare_metrics "$WORK/tp4-cpu" "$WORK/tp4-cuda" 16 6 0.1
