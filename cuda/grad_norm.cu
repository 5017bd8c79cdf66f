// Sum of squares of the fp32 gradient, for the global norm of gradient clipping (CPU twin: ops::sum_squares).
// Accumulated in double like the CPU version, in two fixed-shape stages (per-block partials, then one block), so
// the result has the same bits every run.
#include <algorithm>

#include "grad_norm.cuh"

#include "device.cuh"

namespace yuan::gpu {
namespace {

constexpr int kThreads = 256;
// The partials' slots: the cap binds where grid_for's 8 blocks per SM exceed it (an H100's 1056 blocks, above
// 262,144 elements at 256 threads; never on an A100's 864), and the loop strides again above 1024 x 256 elements.
constexpr int kMaxBlocks = 1024;

__global__ void sum_squares_partial_kernel(double* partials, const float* x, size_t n) {
  __shared__ double scratch[kThreads / kWarpSize];
  double acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc += static_cast<double>(x[i]) * x[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_squares_final_kernel(double* result, const double* partials, int n) {
  __shared__ double scratch[kThreads / kWarpSize];
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *result = acc;
}

}  // namespace

size_t sum_squares_partials_size() { return kMaxBlocks + 1; }

double sum_squares(const float* x, size_t n, double* partials, cudaStream_t s) {
  const unsigned blocks = std::min<unsigned>(grid_for(n, kThreads), kMaxBlocks);
  {
    const OpScope op({"grad_norm", "grad_norm", {"n=%lld", {static_cast<long long>(n)}},
                      ops::grad_norm_cost(static_cast<double>(n))});
    launch(sum_squares_partial_kernel, blocks, kThreads, 0, s, partials, x, n);
    launch(sum_squares_final_kernel, 1, kThreads, 0, s, partials + kMaxBlocks, partials, static_cast<int>(blocks));
  }
  double result = 0;
  copy_async(&result, partials + kMaxBlocks, sizeof(double), cudaMemcpyDeviceToHost, s);
  wait_stream(s, "the gradient norm");
  return result;
}

}  // namespace yuan::gpu
