// GELU, tanh approximation (gelu.cu; CPU twin src/ops/gelu.cpp), for a shape where cuBLASLt offers no fused GELU
// epilogue (matmul.cuh).
#pragma once
#include <cstddef>

#include "common.cuh"

namespace yuan::gpu {

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t s);
// dinp = gelu'(inp) * dout; dinp may be dout.
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, cudaStream_t s);

}  // namespace yuan::gpu
