// fp32 <-> bf16 (round to nearest even, as src/util/dtype.h): the working weights' way in and out of the host;
// and the fp32 add that accumulates a micro-batch's reduced gradient shard (ZeRO-3 with the state on the device).
// Any offset and length (ZeRO shards and their pieces start anywhere), so one element per thread; coalesced,
// memory-bound.
#include "cast.cuh"

namespace yuan::gpu {
namespace {

__global__ void f32_to_bf16_kernel(bf16* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void bf16_to_f32_kernel(float* out, const bf16* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void add_f32_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

}  // namespace

void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const OpScope op({"cast_f32_to_bf16", "cast", {"n=%lld", {static_cast<long long>(n)}},
                    ops::copy_cost(static_cast<double>(n), 4, 2)});
  launch(f32_to_bf16_kernel, grid_for(n, 256), 256, 0, s, out, in, n);
}

void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const OpScope op({"cast_bf16_to_f32", "cast", {"n=%lld", {static_cast<long long>(n)}},
                    ops::copy_cost(static_cast<double>(n), 2, 4)});
  launch(bf16_to_f32_kernel, grid_for(n, 256), 256, 0, s, out, in, n);
}

void add_f32(float* dst, const float* src, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const OpScope op({"add_f32", "add", {"n=%lld", {static_cast<long long>(n)}}, ops::add_cost(static_cast<double>(n))});
  launch(add_f32_kernel, grid_for(n, 256), 256, 0, s, dst, src, n);
}

}  // namespace yuan::gpu
