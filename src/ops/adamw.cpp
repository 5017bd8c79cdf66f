#include "ops/adamw.h"

#include <cmath>

#include "util/dtype.h"

namespace yuan::ops {

namespace {

// Below this many elements a parallel region costs more than it saves (biases, LayerNorm, small shards).
constexpr size_t kParallelMin = size_t(1) << 16;

// Vectorises only under -fno-math-errno (the Makefile's CXXFLAGS): with errno semantics GCC keeps every sqrt a
// scalar call guarded by a branch, and the kernel falls to ~1/3 of memory bandwidth.
template <bool kBf16>
void adamw_pass(float* __restrict p, float* __restrict m, float* __restrict v, const float* __restrict g,
                uint16_t* __restrict p_bf16, size_t n, const AdamWHyper& h) {
  // Scalars are formed in double and rounded once to fp32, as PyTorch does with its Python-float arguments.
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.t));
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float b1 = static_cast<float>(h.beta1), a1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), a2 = static_cast<float>(1.0 - h.beta2);
  const float neg_step = static_cast<float>(-(h.lr / bc1));
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(h.eps);
  const float scale = static_cast<float>(h.grad_scale);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * scale;
    float mi = b1 * m[i] + a1 * gi;
    float vi = b2 * v[i] + a2 * gi * gi;
    float denom = std::sqrt(vi) * inv_bc2_sqrt + eps;
    float pi = p[i] * decay + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (kBf16) p_bf16[i] = f32_to_bf16(pi);
  }
}

}  // namespace

void adamw_update(float* p, float* m, float* v, const float* g, uint16_t* p_bf16, size_t n, const AdamWHyper& h) {
  if (p_bf16)
    adamw_pass<true>(p, m, v, g, p_bf16, n, h);
  else
    adamw_pass<false>(p, m, v, g, nullptr, n, h);
}

double sum_squares(const float* x, size_t n) {
  double acc = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

void add(float* __restrict dst, const float* __restrict src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

}  // namespace yuan::ops
