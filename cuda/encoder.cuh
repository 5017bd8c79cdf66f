// Token + position embedding (encoder.cu; CPU twin src/ops/encoder.cpp): out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.cuh"

namespace yuan::gpu {

void encoder_forward(bf16* out, const int32_t* tok, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     int tok_stride, cudaStream_t s);
// The embedding backward sums dout rows per token id without atomics, so gradients are the same bits every run.
// The grouping is built on the host, where the tokens are: token_groups() returns
//   [n_groups | n_groups+1 offsets into rows | n_groups token ids | B*T rows (b*T + t) sorted by token]
// (at most token_groups_max_size(B, T) values) and encoder_backward reads that array in device memory.
std::vector<int32_t> token_groups(const int32_t* tok, int B, int T, int tok_stride);
size_t token_groups_max_size(int B, int T);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups, int n_groups, int B, int T,
                      int C, cudaStream_t s);

}  // namespace yuan::gpu
