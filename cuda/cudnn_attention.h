// Causal self-attention through cuDNN's fused SDPA engines (cudnn_attention.cpp): the math of attention.cuh and of
// its CPU twin src/ops/attention.cpp, on the same tensors. qkv[B,T,3C] -> out[B,T,C], and the natural-log
// logsumexp of each query row's scaled scores, lse[B,NH,T] (cuDNN's "stats"), kept for the backward: the state is
// the same on both paths. Head size hs = C/NH a multiple of 8, at most 256 (cuDNN 9 on Hopper).
// Host code only (the frontend's graphs launch cuDNN's kernels), built by the host compiler in both builds: nvcc's
// front end takes minutes over the frontend's headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace yuan::gpu {

using bf16 = __nv_bfloat16;

constexpr int kCudnnMaxHeadSize = 256;
// The kernel account's note on traffic: cuDNN's kernels are not this project's to itemise.
constexpr const char* kCudnnAttentionExempt = "cuDNN's fused kernels: their tiling and re-reads are cuDNN's";

// Why this process cannot run attention of head size `head_size` over `seq_len` positions through cuDNN, or ""
// when it can: a head size cuDNN does not take, a single position (the frontend refuses a backward of one query
// and one key), a build without the frontend's headers, libcudnn.so.9 not found or older than the frontend needs,
// a device below sm_80. `planning` (yuanlm plan, perhaps on a machine without the GPU's libraries) asks only what
// the build and the shape decide.
std::string cudnn_attention_problem(int head_size, int seq_len, bool planning = false);
// "cuDNN 9.19.0 (frontend 1.32.0)", for the start-up line; "" without cuDNN.
std::string cudnn_attention_library();

// Bytes of workspace the two graphs may ask for (the memory plan counts it as the attention's scratch; a graph
// asking for more is an error naming both): the deterministic backward's fp32 dQ accumulator [B,NH,T,hs] and its
// softmax sums [B,NH,T], and as much again for the engines' own use.
size_t cudnn_attention_workspace_bytes(int B, int T, int C, int NH);

// Integration faults a graph could be built with, each off in training. tests/cuda/test_cudnn_attention.cu plants
// them one at a time to show that the emulated cuDNN reports each (a wrong result, or cuDNN's refusal), as the
// first GPU would.
struct CudnnGraphFaults {
  bool head_time_strides_swapped = false;  // Q, K, V described as [B, T, NH, hs] read in [B, NH, T, hs] order
  bool no_causal_mask = false;
  bool no_stats_to_backward = false;  // the backward's variant pack without the forward's logsumexp
  bool operator<(const CudnnGraphFaults& o) const;
};

// `workspace`: `workspace_bytes` of device memory the call may use until it completes on `s`.
void cudnn_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, void* workspace,
                             size_t workspace_bytes, cudaStream_t s, const CudnnGraphFaults& faults = {});
// dqkv = gradient of qkv (written). Deterministic: the same bits every run.
void cudnn_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B,
                              int T, int C, int NH, void* workspace, size_t workspace_bytes, cudaStream_t s,
                              const CudnnGraphFaults& faults = {});

}  // namespace yuan::gpu
