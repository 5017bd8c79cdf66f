// Causal self-attention, flash style (attention.cu; CPU twin src/ops/attention.cpp) on qkv[B,T,3C] -> out[B,T,C].
// Saves only lse[B,NH,T] (natural-log logsumexp of each query row's scaled scores) for backward, which
// recomputes the probabilities. Head size hs = C/NH must be a multiple of 8 and at most 128.
#pragma once
#include "common.cuh"

namespace yuan::gpu {

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s);
// dqkv = gradient of qkv (written); `delta` is scratch of B*NH*T floats.
void attention_backward(bf16* dqkv, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s);

}  // namespace yuan::gpu
