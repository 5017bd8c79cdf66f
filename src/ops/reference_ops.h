// CPU reference ops of the GPT forward and backward (OpenMP across rows, loops written to vectorise).
// The CUDA kernels in cuda/<family>.cu implement the same math. Conventions, shared by every family:
//   N = B*T rows, C channels, OC output channels, V vocabulary, NH heads, hs = C/NH.
//   Matrices are row-major; weights are [out, in].
//   Backward functions ADD into every gradient they produce (parameter gradients accumulate over
//   micro-batches; the caller zeroes activation gradients).
// What each op costs at the least, its FLOPs and ideal bytes, is derived beside this math in op_cost.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace yuan::ops {

// encoder.cpp — out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
// With tensor parallelism wte holds `vocab_rows` rows from id `vocab_begin` (its rank's part of the vocabulary):
// other ids contribute zero, and only one rank adds wpe (null elsewhere), so that the ranks' outputs sum to the
// embedding. Backward adds into the rows of the ids in range, and every rank into all of dwpe.
void encoder_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int B, int T, int C,
                     int tok_stride, int vocab_begin = 0, int vocab_rows = INT32_MAX);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int B, int T, int C,
                      int tok_stride, int vocab_begin = 0, int vocab_rows = INT32_MAX);

// layernorm.cpp — y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + 1e-5), biased variance over C.
// mean and rstd ([N]) are saved for backward.
constexpr float kLayerNormEps = 1e-5f;
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);
// out = a + b (the residual stream); its backward is dout flowing unchanged into both branches.
void residual_forward(float* out, const float* a, const float* b, size_t n);
// out[i, :] += bias + residual[i, :]: what a row-parallel layer adds once its ranks' partial products are summed.
void bias_residual_add(float* out, const float* bias, const float* residual, int N, int C);

// matmul.cpp — out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be null). OpenBLAS sgemm underneath.
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC);
// dinp += dout @ w; dw += dout^T @ inp; dbias += sum over rows of dout (dbias may be null).
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC);

// attention.cpp — causal multi-head self-attention on qkv[B,T,3C] (q | k | v, each NH heads of hs):
// att = softmax(q k^T / sqrt(hs) + causal mask), out[B,T,C] = att v. att ([B,NH,T,T]) is saved for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv += gradient of qkv; datt is scratch of att's size.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH);

// gelu.cpp — GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// classifier.cpp — fused softmax + cross-entropy over logits[N,V] (computed by the tied wte matmul).
// losses[i] = logsumexp(logits[i]) - logits[i][target[i]]. When dlogits_scale != 0 the logits are
// overwritten in place by their gradient, dlogits_scale * (softmax - onehot(target)), so no second [N,V]
// buffer is needed. Targets are read with `tgt_stride` between rows of T (tokens rows are T+1 long).
void classifier_forward_backward(float* logits, float* losses, const int32_t* targets, int B, int T, int V,
                                 int tgt_stride, float dlogits_scale);
// The same over a vocabulary cut between tensor-parallel ranks (Megatron's vocab-parallel cross-entropy): each
// holds V columns of the logits from id `vocab_begin`, and the full rows are never gathered. Three passes, each
// followed on the caller's side by an all-reduce over the ranks: the row maxima (MAX), then the sums of
// exp(z - max) and the target's logit, 0 on ranks without the target (SUM, `sums` = [2, B*T]), then the losses
// and, with dlogits_scale != 0, the gradient over the logits in place.
void classifier_row_max(const float* logits, float* row_max, int N, int V);
void classifier_row_sums(const float* logits, const float* row_max, const int32_t* targets, int B, int T, int V,
                         int tgt_stride, int vocab_begin, float* sums);
void classifier_parallel_finish(float* logits, float* losses, const float* row_max, const float* sums,
                                const int32_t* targets, int B, int T, int V, int tgt_stride, int vocab_begin,
                                float dlogits_scale);

}  // namespace yuan::ops
