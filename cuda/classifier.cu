// Fused softmax + cross-entropy over the vocabulary, gradient written over the bf16 logits (CPU twin:
// src/ops/classifier.cpp).
//   loss = logsumexp(z) - z[y];   dz = scale * (softmax(z) - onehot(y))
// One block per row. The row is read in 16-byte chunks with a running (max, sum of exp) per thread, merged
// across the block; a second pass writes the gradient. Nothing of the row is kept but those two numbers, so no
// fp32 copy of the logits is ever made.
#include <cfloat>

#include "classifier.cuh"

namespace yuan::gpu {
namespace {

constexpr int kThreads = 512;

// (max, sum) pairs merge as sum_a * e^(max_a - m) + sum_b * e^(max_b - m), m = max(max_a, max_b).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
  m = mm;
}

__global__ void __launch_bounds__(kThreads) classifier_kernel(bf16* logits, float* losses, const int32_t* targets,
                                                              int T, int V, int ld, int tgt_stride, float dscale) {
  __shared__ float s_max[kThreads / kWarpSize], s_sum[kThreads / kWarpSize];
  __shared__ float s_target_logit;
  const int row = blockIdx.x;
  const int b = row / T, t = row % T;
  bf16* z = logits + static_cast<size_t>(row) * ld;
  const int y = targets[static_cast<size_t>(b) * tgt_stride + t];
  constexpr int P = PackBf16::kN;
  // Start from the lowest finite value, not -inf: a thread with no elements then merges as a zero sum without
  // forming inf - inf.
  float m = -FLT_MAX, s = 0;
  for (int c = threadIdx.x * P; c < V; c += kThreads * P) {
    PackBf16 v = load_pack_cs(z + c);  // reads up to 7 padding columns past V: the row stride ld covers them
    float cm = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < P; k++)
      if (c + k < V) cm = fmaxf(cm, __bfloat162float(v.v[k]));
    float cs = 0;
#pragma unroll
    for (int k = 0; k < P; k++)
      if (c + k < V) cs += __expf(__bfloat162float(v.v[k]) - cm);
    merge(m, s, cm, cs);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = s;
  }
  if (threadIdx.x == 0) s_target_logit = __bfloat162float(z[y]);
  __syncthreads();
  m = s_max[0];
  s = s_sum[0];
  for (int w = 1; w < kThreads / kWarpSize; w++) merge(m, s, s_max[w], s_sum[w]);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) losses[row] = lse - s_target_logit;
  if (dscale == 0.0f) return;
  for (int c = threadIdx.x * P; c < V; c += kThreads * P) {
    PackBf16 v = load_pack_cs(z + c), d;
#pragma unroll
    for (int k = 0; k < P; k++) {
      const int i = c + k;
      float g = i < V ? dscale * __expf(__bfloat162float(v.v[k]) - lse) - (i == y ? dscale : 0.0f) : 0.0f;
      d.v[k] = __float2bfloat16(g);
    }
    store_pack_cs(z + c, d);
  }
}

}  // namespace

void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int B, int T, int V, int ld,
                                 int tgt_stride, float dlogits_scale, cudaStream_t s) {
  YUAN_CHECK(ld % PackBf16::kN == 0 && ld >= V, "classifier: row stride %d must be >= V = %d and a multiple of %d",
             ld, V, PackBf16::kN);
  launch(classifier_kernel, B * T, kThreads, 0, s, logits, losses, targets, T, V, ld, tgt_stride, dlogits_scale);
}

}  // namespace yuan::gpu
