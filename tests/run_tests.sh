#!/usr/bin/env bash
# Every test yuanlm has, in one run: the repository's own checks (tools/folder_graph.py, tools/check_references.py)
# and the Python tools' unit tests (tests/py); the GoogleTest suites in one process; the Mpi* suites under mpirun
# with 1, 2, 3 and 4 ranks; the CUDA tests on a GPU when they were built (they skip without one) and on the CPU
# emulator (cuda/emu, make emu), where nothing skips; each end-to-end script in tests/mpi/ (a real `yuanlm` job
# under mpirun, one test each) and each check of the GPU compiler's output in tests/cuda/. A script exiting 77
# counts as skipped. Ends with the line "N passed, N failed", alone, and exits non-zero when a test failed.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
log=build/test-logs
mkdir -p "$log"
pass=0 fail=0 skip=0

# A gtest binary run: its rank-aggregated summary line gives the counts; no summary (crash, hang) is a failure.
gtest() {
  local name=$1
  shift
  timeout 900 "$@" >"$log/$name.log" 2>&1
  local rc=$?
  grep -E '^\[  (FAILED|SKIPPED) *\]|^gtest-summary' "$log/$name.log" | sed "s/^/  $name: /"
  local summary
  summary=$(grep -E '^gtest-summary:' "$log/$name.log" | tail -1)
  if [ -z "$summary" ]; then
    echo "  $name: no summary (exit $rc); last lines of $log/$name.log:"
    tail -20 "$log/$name.log" | sed 's/^/    /'
    fail=$((fail + 1))
    return
  fi
  read -r p f s < <(echo "$summary" | sed -E 's/gtest-summary: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/')
  pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "  $name: exit $rc with no failed test"; fail=$((fail + 1)); }
}

# py_test NAME FILE: /usr/bin/python3 FILE as one test that passes or fails as a whole, its output in $log/NAME.log.
py_test() {
  if /usr/bin/python3 "$2" >"$log/$1.log" 2>&1; then
    pass=$((pass + 1))
    echo "  PASS $1"
  else
    fail=$((fail + 1))
    echo "  FAIL $1; last lines of $log/$1.log:"
    tail -25 "$log/$1.log" | sed 's/^/    /'
  fi
}
# script_test FILE: one end-to-end script as one test; exit 77 skips it (its first "SKIP" line says why).
script_test() {
  local t=$1 name start rc
  name=$(basename "$t" .sh)
  start=$(date +%s)
  timeout 900 bash "$t" >"$log/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    pass=$((pass + 1))
    echo "  PASS $name ($(($(date +%s) - start))s)"
  elif [ "$rc" -eq 77 ]; then  # the test found its environment unable to run it, and said why
    skip=$((skip + 1))
    echo "  SKIP $name: $(grep -m1 '^SKIP' "$log/$name.log")"
  else
    fail=$((fail + 1))
    echo "  FAIL $name ($(($(date +%s) - start))s); last lines of $log/$name.log:"
    tail -25 "$log/$name.log" | sed 's/^/    /'
  fi
}

echo "== the repository's own checks: the folders' include graph has no cycle (tools/folder_graph.py), every path"
echo "   and config key the comments and docs name exists (tools/check_references.py)"
py_test folder_graph tools/folder_graph.py
py_test check_references tools/check_references.py
echo "== the Python tools' unit tests (tests/py)"
for t in tests/py/test_*.py; do py_test "$(basename "$t" .py)" "$t"; done
echo "== GoogleTest, one process"
gtest serial bin/test_yuanlm --gtest_filter='-Mpi*'
for np in 1 2 3 4; do
  echo "== GoogleTest Mpi* suites, mpirun -np $np"
  gtest "mpi-np$np" mpirun -np "$np" bin/test_yuanlm --gtest_filter='Mpi*'
done
if [ -x bin/test_cuda ]; then
  echo "== CUDA kernel tests"
  gtest cuda bin/test_cuda
fi
# The GPU compiler's checks first: they make build/emu/ptxas.txt, each kernel's registers and __launch_bounds__, which
# the emulator checks every launch against (installing NVIDIA's compiler wheels where there is no toolkit, as on a
# fresh clone).
codegen=
if [ -x bin/test_cuda_emu ]; then
  echo "== GPU code checks (tests/cuda/test_codegen.sh): what the emulator checks launches against"
  codegen=tests/cuda/test_codegen.sh
  script_test "$codegen"
  echo "== CUDA tests on the emulator"
  gtest cuda-emu bin/test_cuda_emu
  # Cases whose grids come from the SM count (cuda/common.cuh's grid_for) on a second device: an A100's 108 SMs
  # leave the gradient norm's 1024-block cap unbound, where an H100's bind it, and put the second strides elsewhere
  # (docs/EMULATOR.md, "Test shapes"). The cheapest of them: the others' grids follow the same rule.
  echo "== CUDA tests on the emulator, YUAN_EMU_TARGET=a100"
  gtest cuda-emu-a100 env YUAN_EMU_TARGET=a100 bin/test_cuda_emu \
    --gtest_filter='Ops/OpsConformance.*/sum_squares_past_one_stride*:Ops/OpsConformance.*/add_past_one_stride*:Ops/OpsConformance.*/adamw_past_one_stride*'
  # The work that crosses streams again, with every asynchronous operation run as late (the offload pipeline's
  # copies, NCCL), then as early (the backend's streams and events) as its dependencies allow: docs/EMULATOR.md,
  # "Stream modes". Only what reaches another stream: the offload comparison at 2 micro-batches a step (every copy,
  # event and bucket of the pipeline, test_offload.cu); of the backend's own tests, the program on one backend
  # (its compute stream waiting on the gradient-copy stream) and on two (each its own stream), since the others
  # make the same calls on the compute stream alone; the NCCL deadline test waits on a peer, not on a stream.
  # So the emulator's share of `make test` stays within twice what it was.
  emu_mode() {
    echo "== CUDA tests on the emulator, YUAN_EMU_STREAMS=$1"
    gtest "cuda-emu-$1" env YUAN_EMU_STREAMS="$1" bin/test_cuda_emu \
      --gtest_filter="$2:CudaNccl.OneRankCollectives:Emulator*Stream*.*"
  }
  emu_mode latest 'CudaOffload.*:Accum/CudaOffloadMicroBatches.*/2'
  emu_mode earliest \
    'CudaBackend.ProgramMatchesTheCpuBackend:CudaBackend.TwoStagesComputeTheWholeModel:CudaOffload.DelayedUpdateTrains'
fi
echo "== end-to-end jobs (tests/mpi, across nodes: tests/cluster) and the other checks of tests/cuda"
for t in tests/mpi/test_*.sh tests/cluster/test_*.sh tests/cuda/test_*.sh; do
  [ -e "$t" ] || continue
  [ "$t" = "$codegen" ] && continue  # ran before the emulator's tests
  script_test "$t"
done
[ "$skip" -eq 0 ] || echo "($skip skipped, each named above with its reason)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
