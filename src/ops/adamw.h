// AdamW on a contiguous range of fp32 parameters, in one fused pass (CPU; cuda/adamw_kernel.cu is the GPU twin).
// Per element, with g = grad_scale * grad (grad_scale carries the gradient-clipping factor) and t >= 1:
//   p = p * (1 - lr*wd)                                    decoupled weight decay, before the update
//   m = b1*m + (1-b1)*g,  v = b2*v + (1-b2)*g*g
//   p = p - (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),      bc_i = 1 - b_i^t
// torch.optim.AdamW's order of operations, except that sqrt(v) is multiplied by 1/sqrt(bc2) instead of divided
// by sqrt(bc2): one division fewer per element brings the kernel to the memory-bandwidth limit (make bench) at
// the cost of at most one ulp in the denominator, so results agree with PyTorch to fp32 rounding.
#pragma once
#include <cstddef>
#include <cstdint>

namespace yuan::ops {

struct AdamWHyper {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;
  int64_t t = 1;          // step number, from 1
  double grad_scale = 1;  // multiplies the gradient before anything else
};

// Updates p, m, v in place from g; when p_bf16 is not null it also receives the new p rounded to bf16.
void adamw_update(float* p, float* m, float* v, const float* g, uint16_t* p_bf16, size_t n, const AdamWHyper& h);

// sum of x[i]^2, accumulated in double (squared L2 norm for gradient clipping).
double sum_squares(const float* x, size_t n);

// dst[i] += src[i]: a later micro-batch's reduced gradient into the step's (fp32, each element one rounding, so the
// same bits in any order or thread count).
void add(float* dst, const float* src, size_t n);

}  // namespace yuan::ops
