#!/usr/bin/env bash
# `make bench-gpu` on a GPU machine: the CUDA kernel tests, our training throughput (bin/bench_gpu_train) and the
# PyTorch peer (tools/bench/gpt_torch.py) on the same GPU, at the same micro-batch, then ours / PyTorch per
# config; before them the ZeRO-Offload benchmark (bin/bench_gpu_offload, docs/OFFLOAD.md). The whole log also
# goes to $OUT/bench_gpu.log when OUT is set (the device tool's output folder), else to build/bench_gpu.log.
# Extra arguments go to bench_gpu_train (--steps N, --recompute).
#
# bin/test_cuda and bin/bench_gpu_* link only the core and CUDA objects (no MPI, HDF5 or Boost), so they build
# and run on a bare GPU machine with the CUDA toolkit, GoogleTest for the tests, and PyTorch for the peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
log=${OUT:-build}/bench_gpu.log
mkdir -p "$(dirname "$log")" build
exec > >(tee "$log") 2>&1
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
status=0

echo "== bin/test_cuda"
if [ -x bin/test_cuda ]; then
  bin/test_cuda --gtest_brief=1 || status=1
else
  echo "bin/test_cuda not built (make bin/test_cuda)"; status=1
fi

echo "== bin/bench_gpu_offload (ZeRO-Offload: step breakdown, MFU, yuan-4.7b, largest model)"
if [ -x bin/bench_gpu_offload ]; then
  bin/bench_gpu_offload | tee build/bench_gpu_offload.txt || status=1
else
  echo "bin/bench_gpu_offload not built (make bin/bench_gpu_offload)"; status=1
fi

echo "== bin/bench_gpu_train $*"
if [ ! -x bin/bench_gpu_train ]; then
  echo "bin/bench_gpu_train not built (make bin/bench_gpu_train)"
  exit 1
fi
bin/bench_gpu_train "$@" | tee build/bench_gpu_ours.txt || status=1
configs=$(python3 -c '
import json, sys
print(json.dumps([json.loads(l[len("RESULT "):]) for l in open("build/bench_gpu_ours.txt") if l.startswith("RESULT ")]))')
if [ "$configs" = "[]" ]; then
  echo "no results from bin/bench_gpu_train"
  exit 1
fi

echo "== PyTorch peer (tools/bench/gpt_torch.py)"
python3 tools/bench/gpt_torch.py --configs "$configs" | tee build/bench_gpu_torch.txt || status=1

echo "== ours / PyTorch (tokens/s, same GPU)"
python3 - <<'PY'
import json
ours = {r["name"]: r for r in (json.loads(l[len("RESULT "):]) for l in open("build/bench_gpu_ours.txt")
                               if l.startswith("RESULT "))}
torch = {r["name"]: r for r in (json.loads(l) for l in open("build/bench_gpu_torch.txt") if l.startswith("{"))}
print(f"{'config':<14}{'B':>4}{'ours tok/s':>14}{'MFU':>7}{'torch B':>9}{'torch tok/s':>14}{'ratio':>8}")
for name, o in ours.items():
    t = torch.get(name, {})
    tt = t.get("tokens_per_s", 0.0)
    ratio = f"{o['tokens_per_s'] / tt:.2f}" if tt else "n/a"
    print(f"{name:<14}{o['B']:>4}{o['tokens_per_s']:>14.0f}{o['mfu']:>7.3f}{t.get('B', 0):>9}{tt:>14.0f}{ratio:>8}")
PY
exit $status
