// Causal self-attention, flash style (attention.cu; CPU twin src/ops/attention.cpp) on qkv[B,T,3C] -> out[B,T,C].
// Saves only lse[B,NH,T] (natural-log logsumexp of each query row's scaled scores) for backward, which
// recomputes the probabilities. Head size hs = C/NH must be a multiple of 8 and at most 128.
#pragma once
#include "common.cuh"

namespace yuan::gpu {

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s);
// Why the kernels move more than their ideal bytes (the kernel account's "exempt"): every query block streams the
// key and value blocks before it through shared memory, so K and V are read once per query block (L2 keeps some);
// the backward reads qkv, dout and lse in both its kernels (one per gradient owner, no atomics) and writes and
// reads delta.
constexpr const char* kAttentionForwardExempt = "K and V read once per query block (flash tiling)";
constexpr const char* kAttentionBackwardExempt =
    "K and V read once per query block and Q, dout once per key block (two kernels, one writer per gradient); "
    "delta written and read";
// delta[b,h,t] = the sum over head h's channels of dout * out at (b, t): the first step of the backward, its own
// kernel (a grid-stride loop over B T NH rows), apart so that a test reaches its second stride without the cost of
// that much attention.
void attention_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int C, int NH, cudaStream_t s);
// dqkv = gradient of qkv (written); `delta` is scratch of B*NH*T floats.
void attention_backward(bf16* dqkv, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s);

}  // namespace yuan::gpu
