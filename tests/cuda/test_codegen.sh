#!/usr/bin/env bash
# What the GPU compiler makes of the kernels, checked without a GPU: every kernel of cuda/*.cu, compiled for
# CUDA_ARCH (sm_90), spills no register (ptxas -v), and the attention kernels' SASS runs on the tensor cores
# (HMMA.16816.F32.BF16, the mma.sync of cuda/ptx.cuh) fed by ldmatrix (LDSM). The kernels need only the CUDA
# runtime's headers, so the toolkit's nvcc is used when there is one; otherwise nvcc, ptxas and their headers come
# from NVIDIA's PyPI wheels, installed into build/cuda-tools by pip. cuobjdump (and the nvdisasm it runs) is not
# in every toolkit and comes from the wheels when missing. Skipped (77) only when neither is available.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch=${CUDA_ARCH:-sm_90}
out=build/codegen
tools=build/cuda-tools/nvidia/cu13/bin
mkdir -p "$out"

# The versions these checks were written against: the 13.0 compiler; cuobjdump and nvdisasm start at 13.2 on PyPI
# and read 13.0's cubins.
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
        nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37)
install_wheels() {
  [ -x "$tools/nvcc" ] && [ -x "$tools/cuobjdump" ] && return 0
  # One pip call: the wheels share the nvidia/cu13 directory, which a second --target install would replace.
  /usr/bin/python3 -m pip install --quiet --no-deps --target build/cuda-tools "${wheels[@]}" >"$out/pip.log" 2>&1 ||
    { echo "SKIP: no CUDA toolkit, and NVIDIA's compiler wheels did not install: $(tail -1 "$out/pip.log")"; exit 77; }
}

nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if [ ! -x "$nvcc" ]; then
  install_wheels
  nvcc=$tools/nvcc
fi
cuobjdump=$(dirname "$nvcc")/cuobjdump
if [ ! -x "$cuobjdump" ]; then
  install_wheels
  cuobjdump=$tools/cuobjdump
fi
echo "nvcc: $nvcc ($("$nvcc" --version | tail -1)), cuobjdump: $cuobjdump"

# The Makefile compiles each kernel file to a cubin with ptxas -v (build/codegen) and gathers ptxas's report and the
# cubin's attributes in build/emu/ptxas.txt, the table the emulator checks launches against and takes occupancy from
# (cuda/emu/ptxas_table.sh): one name, registers, static shared bytes, spill stores and loads, and the maximum
# threads of __launch_bounds__ per kernel. A make running this script must not lend it its jobs.
MAKEFLAGS= make -s PTXAS_NVCC="$nvcc" PTXAS_CUOBJDUMP="$cuobjdump" CUDA_ARCH="$arch" build/emu/ptxas.txt
fail=0
while read -r kernel _ _ stores loads _; do
  if [ "$stores" != 0 ] || [ "$loads" != 0 ]; then
    echo "FAIL: $(c++filt "$kernel") spills: $stores bytes stored, $loads bytes loaded"
    fail=1
  fi
done < build/emu/ptxas.txt
echo "$(wc -l < build/emu/ptxas.txt) kernels, $(awk '$4 == 0 && $5 == 0' build/emu/ptxas.txt | wc -l) without spills"
# The kernels declared with __launch_bounds__ must state it in the table, or the emulator checks their launches
# against the device's 1024 threads only: at least one a kernel file that declares it.
bounded=$(awk '$6 > 0' build/emu/ptxas.txt | wc -l)
echo "$bounded kernels state __launch_bounds__'s maximum threads"
if [ "$bounded" -lt "$(grep -l '__launch_bounds__' cuda/*.cu | wc -l)" ]; then
  echo "FAIL: the table lost __launch_bounds__ (cuobjdump -elf's EIATTR_MAX_THREADS, cuda/emu/ptxas_table.sh)"
  fail=1
fi

# Each attention kernel's SASS section must hold tensor-core MMAs and ldmatrix loads.
PATH=$(dirname "$cuobjdump"):$PATH "$cuobjdump" -sass "$out/attention.cubin" >"$out/attention.sass"
while read -r kernel hmma ldsm; do
  echo "$(c++filt "$kernel"): $hmma HMMA.16816.F32.BF16, $ldsm LDSM"
  if [ "$hmma" = 0 ] || [ "$ldsm" = 0 ]; then
    echo "FAIL: $(c++filt "$kernel") does not run on the tensor cores"
    fail=1
  fi
done < <(awk '/Function :/ { if (k) print k, h, l; k = $3; h = 0; l = 0 }
              /HMMA\.16816\.F32\.BF16/ { h++ } /LDSM\.16\./ { l++ }
              END { if (k) print k, h, l }' "$out/attention.sass" | grep "attention_\(forward\|backward_kv\|backward_q\)_kernel")
[ "$(grep -c "Function :.*attention_\(forward\|backward_kv\|backward_q\)_kernel" "$out/attention.sass")" -eq 12 ] ||
  { echo "FAIL: expected 12 attention kernels (3 kinds x 4 head sizes) in the SASS"; fail=1; }
exit $fail
