// AdamW on the GPU (optim.offload=none): the same math as src/ops/adamw.h, which states it, with the same fp32
// scalars formed in double on the host, so a GPU step matches a CPU step to fp32 rounding (FMA contraction aside).
#include <cmath>

#include "adamw_kernel.cuh"

namespace yuan::gpu {
namespace {

struct AdamWScalars {
  float decay, b1, a1, b2, a2, neg_step, inv_bc2_sqrt, eps, scale;
};

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, bf16* p_bf16, size_t n, AdamWScalars k) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float gi = g[i] * k.scale;
    float mi = k.b1 * m[i] + k.a1 * gi;
    float vi = k.b2 * v[i] + k.a2 * gi * gi;
    float denom = sqrtf(vi) * k.inv_bc2_sqrt + k.eps;
    float pi = p[i] * k.decay + k.neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p_bf16) p_bf16[i] = __float2bfloat16_rn(pi);
  }
}

}  // namespace

void adamw_update(float* p, float* m, float* v, const float* g, bf16* p_bf16, size_t n, const ops::AdamWHyper& h,
                  cudaStream_t s) {
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.t));
  AdamWScalars k;
  k.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  k.b1 = static_cast<float>(h.beta1);
  k.a1 = static_cast<float>(1.0 - h.beta1);
  k.b2 = static_cast<float>(h.beta2);
  k.a2 = static_cast<float>(1.0 - h.beta2);
  k.neg_step = static_cast<float>(-(h.lr / bc1));
  k.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = static_cast<float>(h.eps);
  k.scale = static_cast<float>(h.grad_scale);
  launch(adamw_kernel, grid_for(n, 256), 256, 0, s, p, m, v, g, p_bf16, n, k);
}

}  // namespace yuan::gpu
