// LayerNorm over the channels (layernorm.cu; CPU twin src/ops/layernorm.cpp): y = (x - mean) * rstd * w + b.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace yuan::gpu {

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                       int C, cudaStream_t s);
// The residual stream's gradient is kept in fp32 (dres) and accumulates over both LayerNorms of every layer;
// the backward adds its input gradient to it and refreshes dres_bf16, the rounded copy the next matmul reads.
// dw, db (fp32 parameter gradients) are added to; `partials` is scratch of layernorm_partials_size(C) floats.
void layernorm_backward(float* dres, bf16* dres_bf16, float* dw, float* db, float* partials, const bf16* dout,
                        const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t s);
size_t layernorm_partials_size(int C);
// out[i, :] += bias + residual[i, :] (CPU twin bias_residual_add): the bias and residual a row-parallel layer adds
// once its tensor ranks' partial products are summed.
void bias_residual(bf16* out, const bf16* bias, const bf16* residual, int N, int C, cudaStream_t s);

}  // namespace yuan::gpu
