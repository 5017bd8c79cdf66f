// The CUDA kernels of the GPT forward and backward, one family per file in cuda/, each the twin of
// src/ops/<family>.cpp (whose header, src/ops/ops.h, states the math and the conventions: N = B*T rows, C channels,
// OC output channels, weights [out, in], row-major). Differences from the CPU ops, all for speed:
//   - weights and activations are bf16 (every sum in fp32); parameter gradients are fp32 and, as on the CPU,
//     ADDED into; activation gradients are written, not added, unless a function says otherwise;
//   - every launcher takes the stream it runs on and returns without waiting, unless it returns a value;
//   - C % 8 == 0 and 16-byte aligned tensors (one 16-byte vector = 8 bf16 is the unit of every access).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common.cuh"
#include "ops/adamw.h"

namespace yuan::gpu {

// ---- encoder.cu ----
void encoder_forward(bf16* out, const int32_t* tok, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     int tok_stride, cudaStream_t s);
// The embedding backward sums dout rows per token id without atomics, so gradients are the same bits every run.
// The grouping is built on the host, where the tokens are: token_groups() returns
//   [n_groups | n_groups+1 offsets into rows | n_groups token ids | B*T rows (b*T + t) sorted by token]
// and encoder_backward reads that array uploaded to the device.
std::vector<int32_t> token_groups(const int32_t* tok, int B, int T, int tok_stride);
size_t token_groups_max_size(int B, int T);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups, int n_groups, int B, int T,
                      int C, cudaStream_t s);

// ---- layernorm.cu ----
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                       int C, cudaStream_t s);
// The residual stream's gradient is kept in fp32 (dres) and accumulates over both LayerNorms of every layer;
// the backward adds its input gradient to it and refreshes dres_bf16, the rounded copy the next matmul reads.
// dw, db (fp32 parameter gradients) are added to; `partials` is scratch of layernorm_partials_size(C) floats.
void layernorm_backward(float* dres, bf16* dres_bf16, float* dw, float* db, float* partials, const bf16* dout,
                        const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t s);
size_t layernorm_partials_size(int C);

// ---- gelu.cu ---- (used when cuBLASLt offers no fused GELU epilogue for a shape; see matmul.cu)
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t s);
// dinp = gelu'(inp) * dout; dinp may be dout.
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, cudaStream_t s);

// ---- matmul.cu ----
// cuBLASLt GEMMs, bf16 operands, fp32 accumulation. One per backend: it owns the handle and the per-shape plans
// and uses the workspace and bias scratch it is given (they are part of the memory plan).
class Matmul {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
  Matmul(void* workspace, float* bias_scratch, size_t bias_scratch_count);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  // out[N,OC] (row stride ld_out) = inp[N,C] @ w[OC,C]^T + bias[OC] + residual[N,OC]; bias and residual may be
  // null. With pre_gelu: pre_gelu = that sum and out = gelu(pre_gelu), for the MLP (fused GELU epilogue).
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, const bf16* residual, bf16* pre_gelu,
               int N, int C, int OC, int ld_out, cudaStream_t s);
  // dinp[N,C] = dout @ w, times gelu'(pre_gelu) when pre_gelu is given (the MLP's GELU backward, fused);
  // dw[OC,C] += dout^T @ inp and dbias[OC] += column sums of dout, both fp32. dout has row stride ld_dout.
  void backward(bf16* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp, const bf16* w,
                const bf16* pre_gelu, int N, int C, int OC, int ld_dout, cudaStream_t s);
  // false: skip the GELU_AUX_BIAS, DGELU and BGRADB epilogues and always take the unfused kernels that stand in
  // when cuBLASLt has no algorithm for them, so that tests can check that path on any GPU.
  bool fuse_epilogues = true;

 private:
  struct Plan;
  struct Call;
  bool run(const Call& c, cudaStream_t s);  // false: cuBLASLt has no algorithm for this fused epilogue
  Plan& plan(const Call& c);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  float* bias_scratch_;
  size_t bias_scratch_count_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
};

// ---- attention.cu ----
// Causal self-attention on qkv[B,T,3C] -> out[B,T,C]; saves only lse[B,NH,T] (natural-log logsumexp of each
// query row's scaled scores) for backward, which recomputes the probabilities. Head size hs = C/NH must be a
// multiple of 8 and at most 128.
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s);
// dqkv = gradient of qkv (written); `delta` is scratch of B*NH*T floats.
void attention_backward(bf16* dqkv, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s);

// ---- classifier.cu ----
// Fused softmax + cross-entropy over bf16 logits[N, V] (row stride ld): losses[i] = logsumexp - logit of target.
// With dlogits_scale != 0 the logits are overwritten by dlogits_scale * (softmax - onehot), as on the CPU.
// Columns [V, ld) are padding, ignored by the loss whatever they hold. The gradient is written in whole 8-value
// vectors, so the padding up to V rounded up to 8 becomes zero and the rest of it is left as it was.
void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int B, int T, int V, int ld,
                                 int tgt_stride, float dlogits_scale, cudaStream_t s);

// ---- cast.cu ----
void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t s);
void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t s);

// ---- grad_norm.cu ----
// sum of x[i]^2 accumulated in double, in a fixed order (the same bits every run); waits for the result.
// `partials` is scratch of sum_squares_partials_size() doubles.
double sum_squares(const float* x, size_t n, double* partials, cudaStream_t s);
size_t sum_squares_partials_size();

// ---- adamw.cu ----
// ops::adamw_update on the GPU: p, m, v, g fp32 in device memory; p_bf16 (may be null) receives bf16(p).
void adamw_update(float* p, float* m, float* v, const float* g, bf16* p_bf16, size_t n, const ops::AdamWHyper& h,
                  cudaStream_t s);

}  // namespace yuan::gpu
