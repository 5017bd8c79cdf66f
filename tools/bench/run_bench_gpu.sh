#!/usr/bin/env bash
# `make bench-gpu` on a GPU machine, and the one call to make on a GPU machine lent for a few minutes (with the kit
# of env/device-kit.sh sourced first): each stage below under a time limit of its own, in the order of what it is
# worth, so that the limits' sum (about 30 minutes) or a shorter lease cuts the least useful ones. The stages' logs
# and results go to these files in $OUT when OUT is set (the device tool's output folder, whose files come back
# even when the call runs out of time; at most 8), else in build/bench-gpu/:
#   env.txt      the GPU, driver, host, and which binaries are there
#   account.txt  the kernel account first, about 4 minutes in all, so that a GPU lent for five returns it:
#                yuanlm train --profile.kernels=3:4 for gpt-small (micro-batch 32 x 1024) and gpt-xl (8 x 2048), on
#                random tokens; the PyTorch peer's account of gpt-small (gpt_torch.py --account); then
#                tools/kernel_account.py: ours beside the peer's by family, and gpt-xl's
#   kernels_gpt-small.json, kernels_gpt-xl.json  the trainer's run.dir/kernels.json of those runs
#   kernels_torch_gpt-small.json                 the peer's, in the same schema
#   train.txt    first bin/bench_gpu_attention (about 15 s): attention alone, forward and backward, on both paths
#                (model.attention: own, cuDNN's fused SDPA) at gpt-small's micro-batch (32 x 1024, 12 heads of 64)
#                and Yuan-4.7B's (1 x 2048, 24 heads of 128): TFLOP/s, the fraction of the bf16 peak, cuDNN's time
#                against own's (own alone, with the reason, where cuDNN's does not run)
#   correct.log  bin/test_cuda; tests/mpi/test_gpu_loss_curve.sh (the demo's GPU loss curve against the CPU's);
#                compute-sanitizer's memcheck over 3 training steps with evaluation and a checkpoint
#   train.txt    then bin/bench_gpu_train (GPT program + GPU AdamW: tokens/s, MFU) with model.attention's auto, and
#                where that took cuDNN's attention gpt-small again with own's, the two steps against each other;
#                last, the PyTorch peer (tools/bench/gpt_torch.py, torch.compile) at the same micro-batches, then ours
#                / PyTorch per config
#   trainer.txt  yuanlm train gpt-small on random tokens, micro-batch 32 x 2 and 64, and the metrics' per-step split
#                (compute_s, optim_s, ...) of its last steps: the trainer's step beside the planner's prediction;
#                then bin/bench_gpu_offload (ZeRO-Offload: step breakdown, MFU; gpt-xl, Yuan-4.7B)
# Extra arguments go to bench_gpu_train (--steps N, --recompute). Exit status: non-zero when a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench-gpu}
mkdir -p "$out"
scratch=$(mktemp -d /tmp/yuanlm-bench-gpu.XXXXXX)  # run directories and the corpus: not among $OUT's files
trap 'rm -rf "$scratch"' EXIT
status=0
t0=$(date +%s)
# stage LIMIT_S FILE TITLE CMD...: CMD under `timeout LIMIT_S`, its output appended to FILE; a failure or a
# timeout marks the run failed and says so in FILE.
stage() {
  local limit=$1 file=$out/$2 title=$3 rc
  shift 3
  echo "== $title (at +$(($(date +%s) - t0)) s, limit $limit s)" | tee -a "$file"
  timeout -k 5 "$limit" "$@" >>"$file" 2>&1
  rc=$?
  [ "$rc" -eq 77 ] && { echo "== $title: skipped" | tee -a "$file"; return; }
  [ "$rc" -eq 0 ] || { status=1; echo "== $title: exit $rc$([ "$rc" -eq 124 ] && echo ' (time limit)')" | tee -a "$file"; }
}
have() { [ -x "bin/$1" ] || { echo "bin/$1 not built (make bin/$1)" | tee -a "$out/env.txt"; return 1; }; }

PY=${PY:-/usr/bin/python3}  # with h5py (Debian's here; the kit's env.sh names the GPU machine's)
nvidia-smi -L >/dev/null 2>&1 || { echo "run_bench_gpu: no GPU (nvidia-smi -L fails), nothing to measure"; exit 0; }
{
  date -u +%Y-%m-%dT%H:%MZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  echo "host: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB"
  ls bin/
  command -v mpirun compute-sanitizer python3
} >"$out/env.txt" 2>&1

# The kernel account (docs/BENCHMARKS.md, "GPU"). The trainer's steps 3 and 4 (after the first steps' allocations),
# one micro-batch a step: gpt-small at bench_gpu_train's 32 x 1024, gpt-xl at its deck's T 2048 with 8 sequences,
# the tokens bench_gpu_offload fits on an 80 GB H100 (16 x 1024), the optimizer where optim.offload = auto puts it
# (on the device where it fits; the start-up line says which).
# The peer's gpt-small has the deck's padded vocabulary, so that its classifier is the trainer's.
if have yuanlm; then
  stage 20 account.txt "a random-token corpus for gpt-small and gpt-xl" "$PY" tools/bench/random_corpus.py \
    "$scratch/corpus"
  # account NAME LIMIT DECK ARGS...: yuanlm train DECK's kernel account, kept as $out/kernels_NAME.json.
  account() {
    local name=$1 limit=$2 deck=$3
    shift 3
    stage "$limit" account.txt "kernel account: yuanlm train $deck $*" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 bin/yuanlm train "$deck" --data.train="$scratch/corpus/*.h5" \
      --data.val= --train.device=cuda --train.steps=5 --train.log_every=1 --train.eval_every=0 --optim.zero=0 \
      --profile.kernels=3:4 --run.dir="$scratch/account-$name" "$@"
    # Kept also from a stage cut by its limit: the run's last act is its checkpoint (gpt-xl's some 16 GB).
    cp "$scratch/account-$name/kernels.json" "$out/kernels_$name.json" 2>>"$out/account.txt" ||
      echo "== no kernels.json from $name" | tee -a "$out/account.txt"
  }
  account gpt-small 40 input/gpt-small.ini --train.micro_batch=32 --train.global_batch=32
  account gpt-xl 70 input/gpt-xl.ini --train.micro_batch=8 --train.global_batch=8
fi
stage 110 account.txt "kernel account: PyTorch peer, gpt-small" python3 tools/bench/gpt_torch.py --account "$out" \
  --configs '[{"name": "gpt-small", "n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 1024,
               "vocab_size": 50304, "B": 32}]'
for name in gpt-small gpt-xl; do
  accounts=()
  for f in "$out/kernels_$name.json" "$out/kernels_torch_$name.json"; do [ -e "$f" ] && accounts+=("$f"); done
  if [ ${#accounts[@]} -gt 0 ]; then
    stage 10 account.txt "kernel account by family: $name" python3 tools/kernel_account.py "${accounts[@]}"
  fi
done

# Attention alone on both paths: a few seconds of kernels, most of the limit cuDNN's graph building and the start.
if have bench_gpu_attention; then stage 60 train.txt "bin/bench_gpu_attention" bin/bench_gpu_attention; fi

if have test_cuda; then stage 150 correct.log "bin/test_cuda" bin/test_cuda --gtest_brief=1; fi
if have yuanlm; then
  stage 150 correct.log "tests/mpi/test_gpu_loss_curve.sh" bash tests/mpi/test_gpu_loss_curve.sh
  if command -v compute-sanitizer >/dev/null; then
    stage 120 correct.log "compute-sanitizer memcheck, 3 training steps" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 compute-sanitizer --tool memcheck --error-exitcode 9 \
      bin/yuanlm train input/tiny.ini --train.device=cuda --train.steps=3 --train.global_batch=8 \
      --train.log_every=1 --train.eval_every=0 --run.dir="$scratch/sanitizer"
  fi
fi
if have bench_gpu_train; then
  stage 200 train.txt "bin/bench_gpu_train $*" bin/bench_gpu_train "$@"
  # The step with auto's attention against own's, where auto took cuDNN's: gpt-small alone (about 10 s).
  if grep -q '^RESULT {"name":"gpt-small".*"attention":"cudnn"' "$out/train.txt"; then
    stage 60 train.txt "bin/bench_gpu_train --only gpt-small --attention=own $*" bin/bench_gpu_train --only gpt-small \
      --attention=own "$@"
  fi
fi
if have yuanlm; then
  for mb in 32 64; do
    stage 90 trainer.txt "yuanlm train gpt-small, micro-batch $mb, global batch 64" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 bin/yuanlm train input/gpt-small.ini \
      --data.train="$scratch/corpus/*.h5" --data.val= --train.device=cuda --train.steps=12 \
      --train.global_batch=64 --train.micro_batch=$mb --train.log_every=1 --train.eval_every=0 --optim.zero=0 \
      --run.dir="$scratch/trainer$mb"
    tail -4 "$scratch/trainer$mb/metrics.jsonl" >>"$out/trainer.txt" 2>&1
  done
fi
if have bench_gpu_offload; then
  stage 150 trainer.txt "bin/bench_gpu_offload --only xl" bin/bench_gpu_offload --only xl
  stage 180 trainer.txt "bin/bench_gpu_offload --only yuan" bin/bench_gpu_offload --only yuan
fi
# The peer runs each config once, at the micro-batch of its first (model.attention's auto) line.
results=$(python3 -c '
import json, sys
rows = {}
for l in open(sys.argv[1]):
    if l.startswith("RESULT "):
        r = json.loads(l[len("RESULT "):])
        rows.setdefault(r["name"], r)
print(json.dumps(list(rows.values())))
' "$out/train.txt" 2>/dev/null || echo "[]")
if [ "$results" != "[]" ]; then
  stage 300 train.txt "PyTorch peer (tools/bench/gpt_torch.py)" python3 tools/bench/gpt_torch.py --configs "$results"
  python3 - "$out/train.txt" <<'PY' | tee -a "$out/train.txt"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
ours, own = {}, {}
for l in lines:  # auto's line first; own's after it where auto took cuDNN's attention
    if l.startswith("RESULT "):
        r = json.loads(l[len("RESULT "):])
        (own if r["name"] in ours else ours)[r["name"]] = r
# The peer's lines are bare JSON objects (bench_gpu_train's start with "RESULT ").
torch = {r["name"]: r for r in (json.loads(l) for l in lines if l.startswith("{"))}
print(f"{'config':<14}{'B':>4}{'ours tok/s':>14}{'MFU':>7}{'torch B':>9}{'torch tok/s':>14}{'ratio':>8}")
for name, o in ours.items():
    t = torch.get(name, {})
    tt = t.get("tokens_per_s", 0.0)
    ratio = f"{o['tokens_per_s'] / tt:.2f}" if tt else "n/a"
    print(f"{name:<14}{o['B']:>4}{o['tokens_per_s']:>14.0f}{o['mfu']:>7.3f}{t.get('B', 0):>9}{tt:>14.0f}{ratio:>8}")
for name, w in own.items():
    a = ours[name]
    print(f"{name}: attention {a['attention']} {a['tokens_per_s']:.0f} tokens/s (B {a['B']}) against "
          f"{w['attention']} {w['tokens_per_s']:.0f} (B {w['B']}): {a['tokens_per_s'] / w['tokens_per_s']:.3f}x")
PY
fi
echo "== done at +$(($(date +%s) - t0)) s, status $status" | tee -a "$out/env.txt"
exit $status
