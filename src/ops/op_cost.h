// What each op of reference_ops.h (and the optimizer's, adamw.h) costs at the least: its floating-point operations
// and its ideal bytes, the bytes it must read and write once each from the shapes and dtypes, with nothing re-read
// and no scratch. The kernel account (backend/kernel_account.h, profile.kernels) holds every GPU op's measured
// time against these: time_ideal = max(flops / peak FLOP/s, ideal_bytes / peak bandwidth).
//
// Conventions, as reference_ops.h: N = B*T rows, C channels, OC output channels, V vocabulary, NH heads. FLOPs
// count one per add, multiply, compare or transcendental (exp, sqrt, tanh); a fused multiply-add is two. Sizes of
// elements come from the backend (Widths); parameter gradients, LayerNorm's mean and rstd, losses, the residual
// stream's gradient and token ids are 4 bytes on every backend.
#pragma once
#include <cstdint>

namespace yuan::ops {

struct OpCost {
  double flops = 0;
  double bytes = 0;  // ideal: read and written once each
};

// Bytes per element of the weights and activations in the backend's formats (TensorFormats: 4 on the CPU, 2 for
// CUDA's bf16).
struct Widths {
  int weight = 4, act = 4;
};
constexpr int kF32 = 4;  // gradients, statistics, losses, ids

// ---- encoder: out[n,:] = wte[tok[n],:] + wpe[t,:] ----
// One add per output element. Reads every row's wte row (ids may repeat; the bound counts each row once per
// token, as a row seen twice is seldom still in cache), the T wpe rows and the ids; writes out.
inline OpCost encoder_forward_cost(int64_t B, int64_t T, int64_t C, Widths w) {
  const double N = double(B) * T;
  return {N * C, N * C * w.weight + double(T) * C * w.weight + N * kF32 + N * C * w.act};
}
// dwte[tok[n],:] += dout[n,:] and dwpe[t,:] += dout[n,:]: two adds per element of the fp32 dout. Reads dout and
// the ids, reads and writes a dwte row per token and the T rows of dwpe.
inline OpCost encoder_backward_cost(int64_t B, int64_t T, int64_t C) {
  const double N = double(B) * T;
  return {2 * N * C, N * C * kF32 + N * kF32 + 2 * N * C * kF32 + 2 * double(T) * C * kF32};
}

// ---- layernorm: y = (x - mean) * rstd * w + b ----
// Per element: the mean's add (1), the variance's subtract, square and add (3), then subtract, two multiplies
// and an add (4): 8 N C. Reads x, w and b; writes y, mean and rstd.
inline OpCost layernorm_forward_cost(int64_t N, int64_t C, Widths w) {
  const double n = double(N) * C;
  return {8 * n, n * w.act + 2.0 * C * w.weight + n * w.act + 2.0 * N * kF32};
}
// Per element: xhat (2), dnorm = dout * w (1), dw += dout * xhat (2), db += dout (1), the two row sums of dnorm
// and dnorm * xhat (3), dx = rstd * (dnorm - sum1/C - xhat * sum2/C) (4) and its add into dres (1): 14 N C.
// Reads dout, x, w, mean and rstd; reads and writes the fp32 dres, dw and db; writes dres_op, dres in the
// activation dtype (none where the two dtypes agree: `writes_dres_op` false).
inline OpCost layernorm_backward_cost(int64_t N, int64_t C, Widths w, bool writes_dres_op) {
  const double n = double(N) * C;
  return {14 * n, 2 * n * w.act + double(C) * w.weight + 2.0 * N * kF32 + 2 * n * kF32 + 4.0 * C * kF32 +
                      (writes_dres_op ? n * w.act : 0)};
}

// out[i,:] += bias + residual[i,:]: two adds per element. Reads out, residual and bias; writes out.
inline OpCost bias_residual_cost(int64_t N, int64_t C, Widths w) {
  const double n = double(N) * C;
  return {2 * n, 3 * n * w.act + double(C) * w.weight};
}

// ---- matmul: out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias) (+ residual) (then GELU, keeping its input) ----
// The GEMM: N*OC dot products of length C, 2 N C OC. The epilogues' element-wise work (the bias and residual
// adds, GELU's dozen) is left out: under a percent of the GEMM for any C above a few hundred, and the GEMM's own
// count is what a device's tensor peak is quoted in. Reads inp and w (and the bias and the residual); writes out
// (and the GELU input, pre_gelu).
inline OpCost matmul_forward_cost(int64_t N, int64_t C, int64_t OC, Widths w, bool bias, bool residual,
                                  bool pre_gelu) {
  const double out = double(N) * OC;
  return {2.0 * N * C * OC, double(N) * C * w.act + double(OC) * C * w.weight + out * w.act +
                                (bias ? OC * w.weight : 0) + (residual ? out * w.act : 0) +
                                (pre_gelu ? out * w.act : 0)};
}
// Two GEMMs of 2 N C OC each: dinp = dout @ w and dw += dout^T @ inp. Reads dout once (both GEMMs want it, the
// bound counts it once), w and inp (and pre_gelu, for GELU's backward); writes dinp; reads and writes the fp32 dw
// (and dbias, which also sums dout's columns: N OC adds, left out as the epilogues above).
inline OpCost matmul_backward_cost(int64_t N, int64_t C, int64_t OC, Widths w, bool dbias, bool pre_gelu) {
  const double in = double(N) * C;
  return {4.0 * N * C * OC, double(N) * OC * w.act + double(OC) * C * w.weight + in * w.act + in * w.act +
                                2.0 * OC * C * kF32 + (dbias ? 2.0 * OC * kF32 : 0) + (pre_gelu ? in * w.act : 0)};
}

// ---- attention: causal softmax(q k^T / sqrt(hs)) v per head, hs = C / NH ----
// Causal: only the T(T+1)/2 (query, key) pairs at or below the diagonal are computed, so the FLOPs are those of
// the causal half, not of the full T x T: per head and pair, q.k and the pair's share of att @ v, 2 hs each; over
// B NH heads, 4 hs B NH T(T+1)/2 = 2 B C T(T+1). The softmax's few FLOPs per pair are left out (their cost is
// the exp unit's, not the tensor cores'). Reads qkv; writes out and the logsumexp per (row, head), kept for
// backward.
inline OpCost attention_forward_cost(int64_t B, int64_t T, int64_t C, int64_t NH, Widths w) {
  const double N = double(B) * T;
  return {2.0 * B * C * T * (T + 1.0), 3 * N * C * w.act + N * C * w.act + N * NH * kF32};
}
// Five products over the causal half (att recomputed from q.k, then d(att) = dout.v, dv = att^T dout,
// dq = d(scores) k, dk = d(scores)^T q): 2.5 times the forward's. Reads qkv, out, dout and the logsumexp; writes
// dqkv (the per-row sums of dout * out in scratch are a kernel's choice, not counted).
inline OpCost attention_backward_cost(int64_t B, int64_t T, int64_t C, int64_t NH, Widths w) {
  const double N = double(B) * T;
  return {5.0 * B * C * T * (T + 1.0), 3 * N * C * w.act + 2 * N * C * w.act + N * NH * kF32 + 3 * N * C * w.act};
}

// ---- classifier: losses = logsumexp(logits) - logits[target], logits then their gradient in place ----
// Per logit: the row maximum's compare (1), exp(z - max) and its sum (3): 4 N V; the gradient adds the softmax's
// multiply, the one-hot's subtract at one column a row (not counted) and the scale (2 more per logit). Reads the
// logits and the targets; writes the losses and, with the gradient, the logits again.
inline OpCost classifier_cost(int64_t N, int64_t V, Widths w, bool gradient) {
  const double n = double(N) * V;
  return {(gradient ? 6 : 4) * n, n * w.act + N * kF32 + N * kF32 + (gradient ? n * w.act : 0)};
}
// The tensor-parallel passes over a rank's V columns. Row maxima: a compare per logit; reads the logits, writes
// one float a row.
inline OpCost classifier_row_max_cost(int64_t N, int64_t V, Widths w) {
  return {double(N) * V, double(N) * V * w.act + N * kF32};
}
// The sums of exp(z - max) (3 per logit) and the target's logit: reads the logits, the maxima and the targets;
// writes two floats a row.
inline OpCost classifier_row_sums_cost(int64_t N, int64_t V, Widths w) {
  return {3.0 * N * V, double(N) * V * w.act + 2.0 * N * kF32 + 2.0 * N * kF32};
}
// The losses from the summed rows (a few FLOPs a row) and, with the gradient, exp(z - max) / sum, the one-hot
// and the scale (4 per logit), read and written in place. Reads the maxima, the sums and the targets; writes the
// losses.
inline OpCost classifier_finish_cost(int64_t N, int64_t V, Widths w, bool gradient) {
  const double n = double(N) * V;
  return {gradient ? 4 * n : 0.0, (gradient ? 2 * n * w.act : 0) + 4.0 * N * kF32 + N * kF32};
}

// ---- memory: copies, casts, fills ----
// n elements read at `src` bytes each and written at `dst` bytes each; no FLOPs (a cast's rounding is not an
// arithmetic operation of the model).
inline OpCost copy_cost(double n, int src, int dst) { return {0, n * (src + dst)}; }
// A fill writes its bytes.
inline OpCost fill_cost(double bytes) { return {0, bytes}; }
// A copy between host and device: the link carries each byte once (its roofline is the link's rate).
inline OpCost transfer_cost(double bytes) { return {0, bytes}; }

// ---- optimizer (adamw.h) ----
// Per parameter: scale the gradient (1), m = b1 m + a1 g (3), v = b2 v + a2 g^2 (4), sqrt(v) * inv + eps (3),
// p = p * decay + neg_step * m / denom (4): 15. Reads the fp32 master, m, v and gradient (16 bytes), writes the
// master, m and v (12) and, when the working weights live on the device in another dtype, their copy
// (`working` bytes: 2 for bf16, 0 for none): 30 bytes a parameter on CUDA.
inline OpCost adamw_cost(double n, int working) { return {15 * n, n * (4 * kF32 + 3 * kF32 + working)}; }
// The gradient's sum of squares for its global norm: a multiply and an add per fp32 element, each read once.
inline OpCost grad_norm_cost(double n) { return {2 * n, n * kF32}; }
// A micro-batch's gradient added into the step's: an add per fp32 element, two read and one written.
inline OpCost add_cost(double n) { return {n, 3 * n * kF32}; }

// ---- collectives: bytes over the link, not memory ----
// What one rank sends of a buffer of `bytes` among P ranks, the figure nccl-tests calls bus bandwidth's: an
// all-reduce 2 (P-1)/P of it (a ring's reduce-scatter then all-gather), a reduce-scatter or an all-gather (of
// `bytes` in all) (P-1)/P, a broadcast or a point-to-point transfer all of it. Its roofline is the link's rate,
// not HBM's; reductions' adds are left out (no tensor-core work).
enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, SendRecv };
inline OpCost collective_cost(Collective c, double bytes, int P) {
  const double share = P > 1 ? double(P - 1) / P : 0;
  switch (c) {
    case Collective::AllReduce: return {0, 2 * share * bytes};
    case Collective::ReduceScatter:
    case Collective::AllGather: return {0, share * bytes};
    case Collective::Broadcast:
    case Collective::SendRecv: return {0, bytes};
  }
  return {};
}

}  // namespace yuan::ops
