#!/usr/bin/env bash
# `make bench`: every CPU benchmark, each printing its result as a ratio against a limit or peer measured in
# the same run. Record results in docs/BENCHMARKS.md with the date and the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# PyTorch, the peer, loads the same OpenBLAS through libblas.so.3: give it the kernels ours gets (matmul.cpp).
if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
echo "# $(date -u +%Y-%m-%d) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
for b in bin/bench_*; do
  case "$b" in *bench_gpu_*) continue ;; esac  # make bench-gpu runs those on a GPU machine
  echo "== $(basename "$b")"
  "$b"
done
echo "== bench_pipeline.sh"
tools/bench/bench_pipeline.sh
echo "== bench_comm.sh"
tools/bench/bench_comm.sh
echo "== bench_local_ckpt.sh"
tools/bench/bench_local_ckpt.sh
echo "== bench_nodes.sh"
tools/bench/bench_nodes.sh || [ $? -eq 77 ]  # 77: the test cluster cannot be made here (its SKIP line says why)
echo "== bench_planner.sh"
tools/bench/bench_planner.sh
