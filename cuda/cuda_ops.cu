// The op vocabulary (backend/ops_interface.h) on the kernels of cuda/ and cuBLASLt GEMMs, all enqueued on the backend's
// compute stream. Where the structure differs from the CPU ops (src/backend/cpu_ops.cpp), it is a fusion:
//   - a residual add rides in the GEMM that produces the branch (matmul_forward's residual is cuBLASLt's C
//     operand, beta 1);
//   - the MLP's GELU and its backward are GEMM epilogues, with the GELU input kept in pre_gelu for backward;
//   - attention keeps only the logsumexp per row and recomputes the probabilities in backward;
//   - LayerNorm's backward adds into the fp32 residual gradient and writes its bf16 copy in the same pass.
//
// Token buffers: load_tokens puts the ids and, after them, the embedding backward's grouping of the inputs
// (encoder.cuh) into the buffer in one copy. The grouping is built on the host, where the ids are, and stays on
// the host too, keyed by the buffer (every micro-batch slot of a program has its own): the backward's grid is
// the run of groups whose ids this rank's part of wte holds, which only the host copy can tell.
#include "cuda_ops.cuh"

#include <cstring>
#include <unordered_map>
#include <vector>

#include "adamw_kernel.cuh"
#include "attention.cuh"
#include "cast.cuh"
#include "classifier.cuh"
#include "cudnn_attention.h"
#include "device.cuh"
#include "encoder.cuh"
#include "grad_norm.cuh"
#include "kernel_account.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "ops/op_cost.h"

namespace yuan::gpu {
namespace {

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <>
constexpr DType dtype_of<float>() { return DType::F32; }

// `t` as T*, after checking that it is a rows x cols tensor of T, dense unless `strided`; `what` names it in the
// error ("matmul_forward out").
template <typename T>
T* arg(const Tensor& t, int64_t rows, int64_t cols, const char* what, bool strided = false) {
  YUAN_CHECK(t.data && t.dtype == dtype_of<T>() && t.rows == rows && t.cols == cols &&
                 (strided ? t.ld >= cols : t.ld == cols),
             "cuda ops: %s must be a %s%s [%lld, %lld] tensor, got %s%s [%lld, %lld] with row stride %lld", what,
             strided ? "" : "dense ", dtype_name(dtype_of<T>()), static_cast<long long>(rows),
             static_cast<long long>(cols), t.data ? "" : "an empty ", dtype_name(t.dtype),
             static_cast<long long>(t.rows), static_cast<long long>(t.cols), static_cast<long long>(t.ld));
  return t.as<T>();
}
// A vector of n values, as one row or one column.
template <typename T>
T* vec(const Tensor& t, int64_t n, const char* what) {
  return arg<T>(t, t.rows == 1 ? 1 : n, t.rows == 1 ? n : 1, what);
}
// Optional arguments: null when empty.
template <typename T>
T* opt(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  return t ? arg<T>(t, rows, cols, what) : nullptr;
}
// Scratch or saved state of at least n values.
template <typename T>
T* space(const Tensor& t, size_t n, const char* what) {
  YUAN_CHECK(t.data && t.dtype == dtype_of<T>() && t.numel() >= n, "cuda ops: %s must hold %zu %s values, got %zu %s",
             what, n, dtype_name(dtype_of<T>()), t.numel(), dtype_name(t.dtype));
  return t.as<T>();
}
// B rows of at least `len` ids.
const int32_t* token_ids(const Tensor& t, int B, int len, const char* what) {
  YUAN_CHECK(t.data && t.dtype == DType::I32 && t.rows == B && t.cols >= len && t.ld == t.cols,
             "cuda ops: %s must be a dense i32 token buffer of %d rows of at least %d ids, got [%lld, %lld]", what, B,
             len, static_cast<long long>(t.rows), static_cast<long long>(t.cols));
  return t.as<int32_t>();
}
int rows(const Tensor& t) { return static_cast<int>(t.rows); }
int cols(const Tensor& t) { return static_cast<int>(t.cols); }
// The first id of a tensor rank's part of the vocabulary, `n` ids long; the kernels compare it with i32 token ids.
// The kernel account's view of each op (kernel_account.cuh): its shape, and its FLOPs and ideal bytes in bf16
// weights and activations (src/ops/op_cost.h).
constexpr ops::Widths kBf16{2, 2};
// The matmuls' shapes name their epilogues, whose bytes differ: bit 0 the bias, 1 the residual, 2 GELU.
const char* matmul_shape(bool bias, bool residual, bool gelu) {
  static const char* const shapes[8] = {"N=%lld C=%lld OC=%lld",
                                        "N=%lld C=%lld OC=%lld +bias",
                                        "N=%lld C=%lld OC=%lld +residual",
                                        "N=%lld C=%lld OC=%lld +bias+residual",
                                        "N=%lld C=%lld OC=%lld +gelu",
                                        "N=%lld C=%lld OC=%lld +bias+gelu",
                                        "N=%lld C=%lld OC=%lld +residual+gelu",
                                        "N=%lld C=%lld OC=%lld +bias+residual+gelu"};
  return shapes[bias | residual << 1 | gelu << 2];
}

int vocab_part(int64_t vocab_begin, int64_t n, const char* what) {
  YUAN_CHECK(vocab_begin >= 0 && vocab_begin + n <= INT32_MAX, "cuda ops: %s of ids [%lld, %lld) beyond i32 token ids",
             what, static_cast<long long>(vocab_begin), static_cast<long long>(vocab_begin + n));
  return static_cast<int>(vocab_begin);
}
// The row stride of logits, which the classifier kernels read in whole 16-byte vectors, padding included.
int logits_row_stride(const Tensor& logits) {
  YUAN_CHECK(logits.ld % PackBf16::kN == 0, "cuda ops: logits row stride %lld is not a whole number of 16-byte vectors",
             static_cast<long long>(logits.ld));
  return static_cast<int>(logits.ld);
}

// The largest bias gradient is the MLP's, 4C wide.
size_t bias_scratch_count(int C) { return 4 * static_cast<size_t>(C); }

// The scratch of one CudaOps: one allocation, carved in 256-byte steps (cuBLASLt's preferred alignment).
struct Scratch {
  size_t ln_partials = 0, norm_partials = 0, bias = 0, workspace = 0, bytes = 0;  // offsets, and the total
  explicit Scratch(int C) {
    ln_partials = take(layernorm_partials_size(C) * sizeof(float));
    norm_partials = take(sum_squares_partials_size() * sizeof(double));
    bias = take(bias_scratch_count(C) * sizeof(float));
    workspace = take(Matmul::kWorkspaceBytes);
  }
  size_t take(size_t n) {
    const size_t off = bytes;
    bytes = (off + n + 255) / 256 * 256;
    return off;
  }
};

class CudaOps final : public Ops {
 public:
  CudaOps(int C, AttentionPath attention, cudaStream_t s)
      : C_(C), attention_(attention), s_(s), scratch_(device_allocation(Scratch(C).bytes)) {
    const Scratch k(C);
    char* base = scratch_.as<char>();
    ln_partials_ = reinterpret_cast<float*>(base + k.ln_partials);
    norm_partials_ = reinterpret_cast<double*>(base + k.norm_partials);
    gemm_ = std::make_unique<Matmul>(base + k.workspace, reinterpret_cast<float*>(base + k.bias),
                                     bias_scratch_count(C));
    CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  }
  // The backend drains its streams before its ops go.
  ~CudaOps() override {
    if (staged_) cudaEventDestroy(staged_);
  }

  // ---- memory ----
  void zero(const Tensor& t) override {
    fill_async(t.data, 0, static_cast<size_t>(t.rows) * t.ld * dtype_size(t.dtype), s_);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    YUAN_CHECK(dst.rows == src.rows && dst.cols == src.cols, "cuda ops: copy of [%lld, %lld] into [%lld, %lld]",
               static_cast<long long>(src.rows), static_cast<long long>(src.cols), static_cast<long long>(dst.rows),
               static_cast<long long>(dst.cols));
    if (src.numel() == 0) return;
    if (dst.dtype == src.dtype) {
      const size_t w = dtype_size(src.dtype);
      copy_2d_async(dst.data, dst.ld * w, src.data, src.ld * w, src.cols * w, src.rows, cudaMemcpyDeviceToDevice, s_);
    } else if (dst.dtype == DType::BF16) {
      gpu::f32_to_bf16(arg<bf16>(dst, dst.rows, dst.cols, "copy dst"), arg<float>(src, src.rows, src.cols, "copy src"),
                       src.numel(), s_);
    } else {
      gpu::bf16_to_f32(arg<float>(dst, dst.rows, dst.cols, "copy dst"), arg<bf16>(src, src.rows, src.cols, "copy src"),
                       src.numel(), s_);
    }
  }
  void to_host_f32(float* dst, const Tensor& src) override {
    if (src.numel() == 0) return;
    if (src.dtype == DType::F32) {
      download(dst, src);
      return;
    }
    YUAN_CHECK(src.dtype == DType::BF16, "cuda ops: to_host_f32 of %s values", dtype_name(src.dtype));
    std::vector<uint16_t> bits(src.numel());
    download(bits.data(), src);
    for (size_t i = 0; i < bits.size(); i++) dst[i] = ::yuan::bf16_to_f32(bits[i]);
  }
  void from_host_f32(const Tensor& dst, const float* src) override {
    if (dst.numel() == 0) return;
    arg<float>(dst, dst.rows, dst.cols, "from_host_f32 dst", true);
    const size_t w = sizeof(float);
    copy_2d_async(dst.data, dst.ld * w, src, dst.cols * w, dst.cols * w, dst.rows, cudaMemcpyHostToDevice, s_);
    wait_stream(s_, "from_host_f32");
  }
  void load_tokens(const Tensor& tokens, const int32_t* host) override {
    const int B = rows(tokens), stride = cols(tokens);
    token_ids(tokens, B, 1, "load_tokens tokens");
    // The rows' inputs, when the rows end with their targets: the only layout whose backward runs
    // (encoder_backward checks that it is that one).
    const int T = stride - 1;
    std::vector<int32_t> groups = token_groups(host, B, T, stride);
    const size_t ids = static_cast<size_t>(B) * stride, bytes = (ids + groups.size()) * sizeof(int32_t);
    wait_event(staged_, "the token staging buffer");  // the previous load has left it
    if (staging_.bytes() < bytes) staging_ = pinned_allocation(bytes, Mem::Data);
    int32_t* stage = staging_.as<int32_t>();
    std::memcpy(stage, host, ids * sizeof(int32_t));
    std::memcpy(stage + ids, groups.data(), groups.size() * sizeof(int32_t));
    // One op whatever the grouping's length, which varies with the ids.
    const OpScope op({"load_tokens", "copy", OpShape{"B=%lld T=%lld", {B, T}}, ops::transfer_cost(bytes), Roof::Host});
    timed("memcpy HtoD", s_,
          [&] { CUDA_CHECK(cudaMemcpyAsync(tokens.data, stage, bytes, cudaMemcpyHostToDevice, s_)); });
    CUDA_CHECK(cudaEventRecord(staged_, s_));
    groups_[tokens.data] = Grouping{B, T, std::move(groups)};
  }

  // ---- encoder ----
  void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int B, int T,
                       int64_t vocab_begin) override {
    const int C = cols(out);
    YUAN_CHECK(!wpe || wpe.rows >= T, "cuda ops: encoder_forward of %d positions with wpe of %lld", T,
               static_cast<long long>(wpe.rows));
    const OpScope op({"encoder_forward", "encoder", OpShape{"B=%lld T=%lld C=%lld", {B, T, C}},
                      ops::encoder_forward_cost(B, T, C, kBf16)});
    gpu::encoder_forward(arg<bf16>(out, static_cast<int64_t>(B) * T, C, "encoder_forward out"),
                         token_ids(tokens, B, T, "encoder_forward tokens"),
                         arg<bf16>(wte, wte.rows, C, "encoder_forward wte"),
                         opt<bf16>(wpe, wpe.rows, C, "encoder_forward wpe"), B, T, C, cols(tokens),
                         vocab_part(vocab_begin, wte.rows, "encoder_forward"), rows(wte), s_);
  }
  void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int B,
                        int T, int64_t vocab_begin) override {
    const int C = cols(dout);
    const int32_t* ids = token_ids(tokens, B, T + 1, "encoder_backward tokens");
    const auto g = groups_.find(tokens.data);
    YUAN_CHECK(g != groups_.end() && g->second.B == B && g->second.T == T && tokens.cols == T + 1,
               "cuda ops: encoder_backward of %d rows of %d tokens needs them loaded as rows of T+1 ids", B, T);
    YUAN_CHECK(dwpe.rows >= T, "cuda ops: encoder_backward of %d positions with wpe of %lld", T,
               static_cast<long long>(dwpe.rows));
    const int begin = vocab_part(vocab_begin, dwte.rows, "encoder_backward");
    const OpScope op({"encoder_backward", "encoder", OpShape{"B=%lld T=%lld C=%lld", {B, T, C}},
                      ops::encoder_backward_cost(B, T, C), Roof::Device, kEncoderBackwardExempt});
    const std::vector<int32_t>& groups = g->second.groups;
    gpu::encoder_backward(arg<float>(dwte, dwte.rows, C, "encoder_backward dwte"),
                          arg<float>(dwpe, dwpe.rows, C, "encoder_backward dwpe"),
                          arg<float>(dout, static_cast<int64_t>(B) * T, C, "encoder_backward dout"),
                          ids + static_cast<size_t>(B) * (T + 1), groups[0],
                          token_group_range(groups, begin, rows(dwte)), begin, B, T, C, s_);
  }

  // ---- layernorm ----
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                         const Tensor& w, const Tensor& b) override {
    const int N = rows(in), C = cols(in);
    const OpScope op({"layernorm_forward", "layernorm", OpShape{"N=%lld C=%lld", {N, C}},
                      ops::layernorm_forward_cost(N, C, kBf16)});
    gpu::layernorm_forward(arg<bf16>(out, N, C, "layernorm_forward out"), vec<float>(mean, N, "layernorm_forward mean"),
                           vec<float>(rstd, N, "layernorm_forward rstd"), arg<bf16>(in, N, C, "layernorm_forward in"),
                           vec<bf16>(w, C, "layernorm_forward w"), vec<bf16>(b, C, "layernorm_forward b"), N, C, s_);
  }
  void layernorm_backward(const Tensor& dres, const Tensor& dres_op, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& in, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override {
    const int N = rows(in), C = cols(in);
    YUAN_CHECK(C == C_, "cuda ops: layernorm_backward of width %d, scratch sized for %d", C, C_);
    const OpScope op({"layernorm_backward", "layernorm", OpShape{"N=%lld C=%lld", {N, C}},
                      ops::layernorm_backward_cost(N, C, kBf16, true), Roof::Device});
    gpu::layernorm_backward(arg<float>(dres, N, C, "layernorm_backward dres"),
                            arg<bf16>(dres_op, N, C, "layernorm_backward dres_op (dres in bf16)"),
                            vec<float>(dw, C, "layernorm_backward dw"), vec<float>(db, C, "layernorm_backward db"),
                            ln_partials_, arg<bf16>(dout, N, C, "layernorm_backward dout"),
                            arg<bf16>(in, N, C, "layernorm_backward in"), vec<bf16>(w, C, "layernorm_backward w"),
                            vec<float>(mean, N, "layernorm_backward mean"),
                            vec<float>(rstd, N, "layernorm_backward rstd"), N, C, s_);
  }

  // ---- matmul ----
  void matmul_forward(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias,
                      const Tensor& residual, const Tensor& pre_gelu) override {
    const int N = rows(in), C = cols(in), OC = rows(w);
    const bool b = bool(bias), r = bool(residual), g = bool(pre_gelu);
    const OpScope op({"matmul_forward", "matmul", OpShape{matmul_shape(b, r, g), {N, C, OC}},
                      ops::matmul_forward_cost(N, C, OC, kBf16, b, r, g)});
    gemm_->forward(arg<bf16>(out, N, OC, "matmul_forward out", true), arg<bf16>(in, N, C, "matmul_forward in"),
                   arg<bf16>(w, OC, C, "matmul_forward w"), bias ? vec<bf16>(bias, OC, "matmul_forward bias") : nullptr,
                   opt<bf16>(residual, N, OC, "matmul_forward residual"),
                   opt<bf16>(pre_gelu, N, OC, "matmul_forward pre_gelu"), N, C, OC, static_cast<int>(out.ld), s_);
  }
  void matmul_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                       const Tensor& in, const Tensor& w, const Tensor& pre_gelu) override {
    const int N = rows(in), C = cols(in), OC = rows(w);
    const bool b = bool(dbias), g = bool(pre_gelu);
    const OpScope op({"matmul_backward", "matmul", OpShape{matmul_shape(b, false, g), {N, C, OC}},
                      ops::matmul_backward_cost(N, C, OC, kBf16, b, g)});
    gemm_->backward(arg<bf16>(dinp, N, C, "matmul_backward dinp"), arg<float>(dw, OC, C, "matmul_backward dw"),
                    dbias ? vec<float>(dbias, OC, "matmul_backward dbias") : nullptr,
                    arg<bf16>(dout, N, OC, "matmul_backward dout", true), arg<bf16>(in, N, C, "matmul_backward in"),
                    arg<bf16>(w, OC, C, "matmul_backward w"), opt<bf16>(pre_gelu, N, C, "matmul_backward pre_gelu"),
                    N, C, OC, static_cast<int>(dout.ld), s_);
  }

  // ---- attention: attention.cu's kernels or cuDNN's (cudnn_attention.cpp), on the same tensors and state ----
  void attention_forward(const Tensor& out, const Tensor& state, const Tensor& scratch, const Tensor& qkv, int B,
                         int T, int NH) override {
    const int C = cols(out);
    const int64_t BT = static_cast<int64_t>(B) * T;
    const bool cudnn = attention_ == AttentionPath::Cudnn;
    const OpScope op({cudnn ? "cudnn_attention_forward" : "attention_forward", "attention",
                      OpShape{"B=%lld T=%lld C=%lld NH=%lld", {B, T, C, NH}},
                      ops::attention_forward_cost(B, T, C, NH, kBf16), Roof::Device,
                      cudnn ? kCudnnAttentionExempt : kAttentionForwardExempt});
    bf16* o = arg<bf16>(out, BT, C, "attention_forward out");
    float* lse = space<float>(state, attention_rows(B, T, NH), "attention_forward state (lse)");
    const bf16* in = arg<bf16>(qkv, BT, 3 * C, "attention_forward qkv");
    if (cudnn)
      cudnn_attention_forward(o, lse, in, B, T, C, NH, scratch.data, scratch.numel() * dtype_size(scratch.dtype), s_);
    else
      gpu::attention_forward(o, lse, in, B, T, C, NH, s_);
  }
  void attention_backward(const Tensor& dqkv, const Tensor& scratch, const Tensor& dout, const Tensor& qkv,
                          const Tensor& out, const Tensor& state, int B, int T, int NH) override {
    const int C = cols(dout);
    const int64_t BT = static_cast<int64_t>(B) * T;
    const bool cudnn = attention_ == AttentionPath::Cudnn;
    const OpScope op({cudnn ? "cudnn_attention_backward" : "attention_backward", "attention",
                      OpShape{"B=%lld T=%lld C=%lld NH=%lld", {B, T, C, NH}},
                      ops::attention_backward_cost(B, T, C, NH, kBf16), Roof::Device,
                      cudnn ? kCudnnAttentionExempt : kAttentionBackwardExempt});
    bf16* d = arg<bf16>(dqkv, BT, 3 * C, "attention_backward dqkv");
    const bf16* dy = arg<bf16>(dout, BT, C, "attention_backward dout");
    const bf16* in = arg<bf16>(qkv, BT, 3 * C, "attention_backward qkv");
    const bf16* y = arg<bf16>(out, BT, C, "attention_backward out");
    const float* lse = space<float>(state, attention_rows(B, T, NH), "attention_backward state (lse)");
    if (cudnn)
      cudnn_attention_backward(d, dy, in, y, lse, B, T, C, NH, scratch.data,
                               scratch.numel() * dtype_size(scratch.dtype), s_);
    else
      gpu::attention_backward(d, space<float>(scratch, attention_rows(B, T, NH), "attention_backward scratch (delta)"),
                              dy, in, y, lse, B, T, C, NH, s_);
  }

  void bias_residual(const Tensor& out, const Tensor& bias, const Tensor& residual) override {
    const int N = rows(out), C = cols(out);
    const OpScope op({"bias_residual", "bias_residual", OpShape{"N=%lld C=%lld", {N, C}},
                      ops::bias_residual_cost(N, C, kBf16)});
    gpu::bias_residual(arg<bf16>(out, N, C, "bias_residual out"), vec<bf16>(bias, C, "bias_residual bias"),
                       arg<bf16>(residual, N, C, "bias_residual residual"), N, C, s_);
  }

  // ---- classifier ----
  void classifier(const Tensor& logits, const Tensor& losses, const Tensor& tokens, int B, int T,
                  float dscale) override {
    const int V = cols(logits);
    const int64_t BT = static_cast<int64_t>(B) * T;
    const OpScope op({dscale != 0 ? "classifier" : "classifier_loss", "classifier", OpShape{"N=%lld V=%lld", {BT, V}},
                      ops::classifier_cost(BT, V, kBf16, dscale != 0)});
    gpu::classifier_forward_backward(arg<bf16>(logits, BT, V, "classifier logits", true),
                                     vec<float>(losses, BT, "classifier losses"),
                                     token_ids(tokens, B, T + 1, "classifier tokens") + 1, B, T, V,
                                     logits_row_stride(logits), cols(tokens), dscale, s_);
  }

  void classifier_row_max(const Tensor& logits, const Tensor& row_max) override {
    const int N = rows(logits), V = cols(logits);
    const OpScope op({"classifier_row_max", "classifier", OpShape{"N=%lld V=%lld", {N, V}},
                      ops::classifier_row_max_cost(N, V, kBf16)});
    gpu::classifier_row_max(arg<bf16>(logits, N, V, "classifier_row_max logits", true),
                            vec<float>(row_max, N, "classifier_row_max row_max"), N, V, logits_row_stride(logits), s_);
  }
  void classifier_row_sums(const Tensor& logits, const Tensor& row_max, const Tensor& tokens, int B, int T,
                           int64_t vocab_begin, const Tensor& sums) override {
    const int V = cols(logits);
    const int64_t BT = static_cast<int64_t>(B) * T;
    const OpScope op({"classifier_row_sums", "classifier", OpShape{"N=%lld V=%lld", {BT, V}},
                      ops::classifier_row_sums_cost(BT, V, kBf16)});
    gpu::classifier_row_sums(arg<bf16>(logits, BT, V, "classifier_row_sums logits", true),
                             vec<float>(row_max, BT, "classifier_row_sums row_max"),
                             token_ids(tokens, B, T + 1, "classifier_row_sums tokens") + 1, B, T, V,
                             logits_row_stride(logits), cols(tokens), vocab_part(vocab_begin, V, "classifier_row_sums"),
                             arg<float>(sums, 2, BT, "classifier_row_sums sums"), s_);
  }
  void classifier_finish(const Tensor& logits, const Tensor& losses, const Tensor& row_max, const Tensor& sums,
                         const Tensor& tokens, int B, int T, int64_t vocab_begin, float dscale) override {
    const int V = cols(logits);
    const int64_t BT = static_cast<int64_t>(B) * T;
    const OpScope op({"classifier_finish", "classifier", OpShape{"N=%lld V=%lld", {BT, V}},
                      ops::classifier_finish_cost(BT, V, kBf16, dscale != 0)});
    gpu::classifier_parallel_finish(arg<bf16>(logits, BT, V, "classifier_finish logits", true),
                                    vec<float>(losses, BT, "classifier_finish losses"),
                                    vec<float>(row_max, BT, "classifier_finish row_max"),
                                    arg<float>(sums, 2, BT, "classifier_finish sums"),
                                    token_ids(tokens, B, T + 1, "classifier_finish tokens") + 1, B, T, V,
                                    logits_row_stride(logits), cols(tokens),
                                    vocab_part(vocab_begin, V, "classifier_finish"), dscale, s_);
  }

  // ---- optimizer ----
  void adamw(const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad, const Tensor& weights,
             const ops::AdamWHyper& h) override {
    const int64_t n = static_cast<int64_t>(master.numel());
    const bool bf16_copy = weights && weights.dtype == DType::BF16;
    const OpScope op({"adamw", "adamw", {"n=%lld", {static_cast<long long>(n)}},
                      ops::adamw_cost(static_cast<double>(n), weights ? static_cast<int>(dtype_size(weights.dtype)) : 0)});
    float* p = vec<float>(master, n, "adamw master");
    gpu::adamw_update(p, vec<float>(m, n, "adamw m"), vec<float>(v, n, "adamw v"), vec<float>(grad, n, "adamw grad"),
                      bf16_copy ? vec<bf16>(weights, n, "adamw weights") : nullptr, static_cast<size_t>(n), h, s_);
    if (weights && !bf16_copy)  // fp32 working weights: the master values themselves
      copy_async(vec<float>(weights, n, "adamw weights"), p, n * sizeof(float), cudaMemcpyDeviceToDevice, s_);
  }
  double sum_squares(const Tensor& x) override {
    return gpu::sum_squares(arg<float>(x, x.rows, x.cols, "sum_squares x"), x.numel(), norm_partials_, s_);
  }
  void add(const Tensor& dst, const Tensor& src) override {
    const int64_t n = static_cast<int64_t>(dst.numel());
    gpu::add_f32(vec<float>(dst, n, "add dst"), vec<float>(src, n, "add src"), static_cast<size_t>(n), s_);
  }

 private:
  struct Grouping {  // the embedding backward's grouping in a token buffer, as token_groups gave it
    int B = 0, T = 0;
    std::vector<int32_t> groups;
  };

  // rows x cols values of `src` into dense host memory; waits for them.
  void download(void* dst, const Tensor& src) {
    const size_t w = dtype_size(src.dtype);
    copy_2d_async(dst, src.cols * w, src.data, src.ld * w, src.cols * w, src.rows, cudaMemcpyDeviceToHost, s_);
    wait_stream(s_, "a download to the host");
  }

  const int C_;
  const AttentionPath attention_;
  cudaStream_t s_;
  Allocation scratch_;  // Scratch(C_): LayerNorm backward and norm partials, bias-gradient scratch, cuBLASLt workspace
  float* ln_partials_ = nullptr;
  double* norm_partials_ = nullptr;
  std::unique_ptr<Matmul> gemm_;
  Allocation staging_;            // pinned: ids and grouping on their way to a token buffer
  cudaEvent_t staged_ = nullptr;  // the last copy out of staging_
  std::unordered_map<const void*, Grouping> groups_;  // by token buffer
};

}  // namespace

size_t attention_rows(int B, int T, int NH) { return static_cast<size_t>(B) * NH * T; }
size_t attention_scratch(int B, int T, int NH, int head_size, AttentionPath path) {
  if (path == AttentionPath::Own) return attention_rows(B, T, NH);
  return (cudnn_attention_workspace_bytes(B, T, head_size * NH, NH) + sizeof(float) - 1) / sizeof(float);
}

// A multiple of 64 keeps every row 128-byte aligned for the GEMMs and the classifier's 16-byte vectors
// (V = 50257 is odd).
int64_t logits_stride(int V) { return (static_cast<int64_t>(V) + 63) / 64 * 64; }

size_t token_slot(int B, int T) { return static_cast<size_t>(B) * (T + 1) + token_groups_max_size(B, T); }

size_t ops_scratch_bytes(int C) { return Scratch(C).bytes; }

std::unique_ptr<Ops> make_cuda_ops(int n_embd, AttentionPath attention, cudaStream_t compute) {
  return std::make_unique<CudaOps>(n_embd, attention, compute);
}

}  // namespace yuan::gpu
