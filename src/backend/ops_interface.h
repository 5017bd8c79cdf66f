// The op vocabulary of the GPT program (src/program/program.h): one interface, implemented once per backend.
// CpuOps (src/backend/cpu_ops.cpp) composes the CPU reference ops of src/ops; CudaOps (cuda/cuda_ops.cu) launches
// the kernels of cuda/ and cuBLASLt. The math of each family is stated once, in src/ops/reference_ops.h; what this
// interface adds is the contract that lets one program drive either backend:
//
//   - Tensors are views of the backend's memory (host or device) with their dtype; an op checks the dtypes and
//     shapes it is given. Weights and activations come in the backend's formats (TensorFormats): fp32 on the CPU,
//     bf16 on CUDA. Parameter gradients and the residual stream's gradient are always fp32.
//   - Parameter gradients are ADDED into (micro-batches accumulate); activation gradients are WRITTEN, except the
//     residual stream's gradient `dres`, which LayerNorm's backward adds into.
//   - `dres` is kept in fp32 and the matmuls read `dres_op`, its copy in the activation dtype, which
//     layernorm_backward refreshes. Where the two dtypes agree (the CPU) there is no copy: `dres_op` is empty and
//     the matmuls read `dres`.
//   - Ops are enqueued in order on the backend's compute stream and return without waiting, except those that
//     hand data to the host (to_host_f32), which wait.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/adamw.h"
#include "util/dtype.h"
#include "util/error.h"

namespace yuan {

// A rows x cols view of a backend's memory with row stride `ld` (elements); a vector is one row.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, ld = 0;

  Tensor() = default;
  Tensor(void* p, DType t, int64_t r, int64_t c, int64_t stride = 0)
      : data(p), dtype(t), rows(r), cols(c), ld(stride ? stride : c) {}
  explicit operator bool() const { return data != nullptr; }
  size_t numel() const { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  // The first `n` rows (a shorter batch in a buffer sized for the longest).
  Tensor first_rows(int64_t n) const {
    YUAN_CHECK(n >= 0 && n <= rows, "tensor: %lld rows asked of %lld", static_cast<long long>(n),
               static_cast<long long>(rows));
    return Tensor(data, dtype, n, cols, ld);
  }
  // Elements [offset, offset + n) of a dense tensor in row order (a run of a backend's flat buffers), as one row.
  Tensor elements(size_t offset, size_t n) const {
    YUAN_CHECK(ld == cols && offset + n <= numel(), "tensor: elements [%zu, %zu) asked of %zu dense ones%s", offset,
               offset + n, numel(), ld == cols ? "" : " (it is strided)");
    return Tensor(static_cast<char*>(data) + offset * dtype_size(dtype), dtype, 1, static_cast<int64_t>(n));
  }
};

// Whose attention kernels run (model.attention; backend/backend.h choose_attention): this project's (attention.cu,
// or the CPU reference) or cuDNN's fused SDPA engines (cuda/cudnn_attention.cpp). Both keep the same state for the
// backward; they differ in the scratch the backward needs.
enum class AttentionPath { Own, Cudnn };
const char* attention_path_name(AttentionPath p);

// How a backend stores the program's tensors. Known without a device, so that memory plans can be computed
// anywhere (src/program/program.h).
struct TensorFormats {
  DType weights = DType::F32;      // working weights, what the ops read
  DType activations = DType::F32;  // activations kept for backward and activation gradients
  // F32 elements an attention forward keeps for its backward (per B, T, NH), and the scratch of the attention's
  // kernels on `path` for heads of `head_size`.
  size_t (*attention_state)(int B, int T, int NH) = nullptr;
  size_t (*attention_scratch)(int B, int T, int NH, int head_size, AttentionPath path) = nullptr;
  // Row stride of the [B*T, V] logits.
  int64_t (*logits_ld)(int V) = nullptr;
  // I32 elements of a token buffer for B rows of T+1 ids (the ids, and whatever the backend derives from them).
  size_t (*token_slot)(int B, int T) = nullptr;
  // Device bytes the backend allocates for itself besides the flat buffers and the programs' memory (its ops'
  // scratch, library workspaces, staging), with ops of row width `width` (BackendSpec::width), for programs of
  // micro-batches up to B rows of T tokens.
  size_t (*workspace_bytes)(int width, int B, int T) = nullptr;
  // What the ops ask of a model's shape, checked where a model meets the backend (program/program.h
  // check_op_constraints): rows a whole number of vectors of `vector_width` elements, and attention heads of a
  // multiple of vector_width elements up to `max_head_size` (0: any size) on the backend's own attention (cuDNN's
  // limits are choose_attention's).
  int vector_width = 1;
  int max_head_size = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // ---- memory ----
  virtual void zero(const Tensor& t) = 0;
  // dst = src, converting the dtype (same shape; the row strides may differ).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // rows x cols fp32 values of `src` into host memory, dense; waits for them.
  virtual void to_host_f32(float* dst, const Tensor& src) = 0;
  // dst.rows x dst.cols fp32 values from dense host memory into fp32 `dst`; waits for them.
  virtual void from_host_f32(const Tensor& dst, const float* src) = 0;
  // tokens.rows rows of tokens.cols ids from host memory into a token buffer (TensorFormats::token_slot, viewed
  // as [B, stride] I32): row b's inputs are ids [0, T), its targets, when stride is T+1, ids [1, T+1). The ops
  // that take `tokens` get the same view.
  virtual void load_tokens(const Tensor& tokens, const int32_t* host) = 0;

  // ---- encoder: out[b,t] = wte[tok[b,t]] + wpe[t]. wte holds the ids from vocab_begin on (a tensor-parallel
  // rank's part: other ids contribute zero, and only one rank passes wpe, the others an empty tensor) ----
  virtual void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int B,
                               int T, int64_t vocab_begin) = 0;
  // dwte += for the ids in range; dwpe += on every rank.
  virtual void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                                int B, int T, int64_t vocab_begin) = 0;

  // ---- layernorm: out = (in - mean) * rstd * w + b; mean, rstd ([N] fp32) kept for backward ----
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                                 const Tensor& w, const Tensor& b) = 0;
  // dres += d(in); dres_op (when not empty) = dres in the activation dtype; dw, db += their gradients.
  virtual void layernorm_backward(const Tensor& dres, const Tensor& dres_op, const Tensor& dw, const Tensor& db,
                                  const Tensor& dout, const Tensor& in, const Tensor& w, const Tensor& mean,
                                  const Tensor& rstd) = 0;

  // ---- matmul: out[N,OC] = in[N,C] @ w[OC,C]^T + bias + residual; with pre_gelu, pre_gelu = that and
  // out = gelu(pre_gelu). bias, residual and pre_gelu may be empty. ----
  virtual void matmul_forward(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias,
                              const Tensor& residual, const Tensor& pre_gelu) = 0;
  // dinp = dout @ w, times gelu'(pre_gelu) when given; dw += dout^T @ in; dbias += column sums of dout (may be
  // empty).
  virtual void matmul_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                               const Tensor& in, const Tensor& w, const Tensor& pre_gelu) = 0;

  // out[i, :] += bias + residual[i, :], after a row-parallel layer's partial products are summed over the ranks.
  virtual void bias_residual(const Tensor& out, const Tensor& bias, const Tensor& residual) = 0;

  // ---- attention: causal self-attention of qkv[B*T, 3C] into out[B*T, C]; `state` (attention_state elements)
  // is what backward needs besides qkv and out; `scratch` (attention_scratch elements) is the kernels' to use
  // until the call's work is done. The backend's AttentionPath decides whose kernels run. ----
  virtual void attention_forward(const Tensor& out, const Tensor& state, const Tensor& scratch, const Tensor& qkv,
                                 int B, int T, int NH) = 0;
  // dqkv = gradient of qkv.
  virtual void attention_backward(const Tensor& dqkv, const Tensor& scratch, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& out, const Tensor& state, int B, int T, int NH) = 0;

  // ---- classifier: losses[b*T+t] = logsumexp(logits) - logits[target]; with dscale != 0 the logits become
  // dscale * (softmax - onehot(target)). Targets are the token buffer's ids [1, T+1) of each row. ----
  virtual void classifier(const Tensor& logits, const Tensor& losses, const Tensor& tokens, int B, int T,
                          float dscale) = 0;
  // The same over a tensor-parallel rank's columns of the logits (ids from vocab_begin), in three passes around
  // the caller's all-reduces: row maxima [B*T] (then MAX), sums [2, B*T] of exp(z - max) and of the target's
  // logit where this rank has it (then SUM), then losses and gradient as classifier() leaves them.
  virtual void classifier_row_max(const Tensor& logits, const Tensor& row_max) = 0;
  virtual void classifier_row_sums(const Tensor& logits, const Tensor& row_max, const Tensor& tokens, int B, int T,
                                   int64_t vocab_begin, const Tensor& sums) = 0;
  virtual void classifier_finish(const Tensor& logits, const Tensor& losses, const Tensor& row_max,
                                 const Tensor& sums, const Tensor& tokens, int B, int T, int64_t vocab_begin,
                                 float dscale) = 0;

  // ---- optimizer (the math of ops/adamw.h) ----
  // AdamW over the fp32 vectors master, m, v from fp32 `grad`, all of master.numel() values; `weights`, when
  // given, receives the new master values in its own dtype (the backend's working copy of the same parameters).
  virtual void adamw(const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad,
                     const Tensor& weights, const ops::AdamWHyper& h) = 0;
  // The sum of squares of fp32 `x`, accumulated in double in a fixed order (the same bits every run); waits for it.
  virtual double sum_squares(const Tensor& x) = 0;
  // dst += src, fp32 vectors of the same length (a micro-batch's reduced gradient into the step's, ZeRO-3 with the
  // state on the device).
  virtual void add(const Tensor& dst, const Tensor& src) = 0;
};

}  // namespace yuan
