// The op vocabulary (backend/ops_interface.h) on the CPU reference ops of src/ops. Those ops ADD into every
// gradient they produce; where the vocabulary says an activation gradient is written, the output is zeroed first,
// which gives the same bits as a write (0 + x == x).
#include <cstring>

#include "backend/cpu_backend.h"
#include "ops/reference_ops.h"

namespace yuan {
namespace {

float* F(const Tensor& t) {
  YUAN_CHECK(t.dtype == DType::F32 && t.ld == t.cols, "cpu ops: tensor of %lld x %lld must be dense f32",
             static_cast<long long>(t.rows), static_cast<long long>(t.cols));
  return t.as<float>();
}
const int32_t* ids(const Tensor& t) {
  YUAN_CHECK(t.dtype == DType::I32, "cpu ops: token buffer must be i32");
  return t.as<const int32_t>();
}
int rows(const Tensor& t) { return static_cast<int>(t.rows); }
int cols(const Tensor& t) { return static_cast<int>(t.cols); }

void zero_floats(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

size_t attention_matrix(int B, int T, int NH) { return static_cast<size_t>(B) * NH * T * T; }

class CpuOps final : public Ops {
 public:
  void zero(const Tensor& t) override { std::memset(t.data, 0, t.rows * t.ld * dtype_size(t.dtype)); }
  void copy(const Tensor& dst, const Tensor& src) override {
    YUAN_CHECK(dst.rows == src.rows && dst.cols == src.cols, "cpu ops: copy between shapes");
    std::memcpy(F(dst), F(src), src.numel() * sizeof(float));
  }
  void to_host_f32(float* dst, const Tensor& src) override {
    std::memcpy(dst, F(src), src.numel() * sizeof(float));
  }
  void from_host_f32(const Tensor& dst, const float* src) override {
    std::memcpy(F(dst), src, dst.numel() * sizeof(float));
  }
  void load_tokens(const Tensor& tokens, const int32_t* host) override {
    std::memcpy(tokens.data, host, tokens.numel() * sizeof(int32_t));
  }

  void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int B, int T,
                       int64_t vocab_begin) override {
    ops::encoder_forward(F(out), ids(tokens), F(wte), wpe ? F(wpe) : nullptr, B, T, cols(out), cols(tokens),
                         static_cast<int>(vocab_begin), rows(wte));
  }
  void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int B,
                        int T, int64_t vocab_begin) override {
    ops::encoder_backward(F(dwte), F(dwpe), F(dout), ids(tokens), B, T, cols(dout), cols(tokens),
                          static_cast<int>(vocab_begin), rows(dwte));
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                         const Tensor& w, const Tensor& b) override {
    ops::layernorm_forward(F(out), F(mean), F(rstd), F(in), F(w), F(b), rows(in), cols(in));
  }
  void layernorm_backward(const Tensor& dres, const Tensor& dres_op, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& in, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd) override {
    YUAN_CHECK(!dres_op, "cpu ops: activations are fp32, so the residual gradient has no operand copy");
    ops::layernorm_backward(F(dres), F(dw), F(db), F(dout), F(in), F(w), F(mean), F(rstd), rows(in), cols(in));
  }

  void matmul_forward(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias,
                      const Tensor& residual, const Tensor& pre_gelu) override {
    const int N = rows(in), C = cols(in), OC = rows(w);
    const Tensor& dst = pre_gelu ? pre_gelu : out;
    ops::matmul_forward(F(dst), F(in), F(w), bias ? F(bias) : nullptr, N, C, OC);
    if (residual) ops::residual_forward(F(dst), F(dst), F(residual), dst.numel());
    if (pre_gelu) ops::gelu_forward(F(out), F(pre_gelu), out.numel());
  }
  void matmul_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                       const Tensor& in, const Tensor& w, const Tensor& pre_gelu) override {
    const int N = rows(in), C = cols(in), OC = rows(w);
    // With GELU the product is d(gelu output); the op's output is that times gelu'(pre_gelu).
    float* prod = pre_gelu ? scratch(dinp.numel()) : F(dinp);
    zero_floats(prod, dinp.numel());
    ops::matmul_backward(prod, F(dw), dbias ? F(dbias) : nullptr, F(dout), F(in), F(w), N, C, OC);
    if (!pre_gelu) return;
    zero_floats(F(dinp), dinp.numel());
    ops::gelu_backward(F(dinp), F(pre_gelu), prod, dinp.numel());
  }

  void bias_residual(const Tensor& out, const Tensor& bias, const Tensor& residual) override {
    ops::bias_residual_add(F(out), F(bias), F(residual), rows(out), cols(out));
  }

  void attention_forward(const Tensor& out, const Tensor& state, const Tensor&, const Tensor& qkv, int B, int T,
                         int NH) override {
    YUAN_CHECK(state.numel() >= attention_matrix(B, T, NH), "cpu ops: attention state too small");
    ops::attention_forward(F(out), F(state), F(qkv), B, T, cols(out), NH);
  }
  void attention_backward(const Tensor& dqkv, const Tensor& scratch, const Tensor& dout, const Tensor& qkv,
                          const Tensor&, const Tensor& state, int B, int T, int NH) override {
    YUAN_CHECK(scratch.numel() >= attention_matrix(B, T, NH), "cpu ops: attention scratch too small");
    zero(dqkv);
    ops::attention_backward(F(dqkv), F(scratch), F(dout), F(qkv), F(state), B, T, cols(dout), NH);
  }

  void classifier(const Tensor& logits, const Tensor& losses, const Tensor& tokens, int B, int T,
                  float dscale) override {
    ops::classifier_forward_backward(F(logits), F(losses), ids(tokens) + 1, B, T, cols(logits), cols(tokens),
                                     dscale);
  }
  void classifier_row_max(const Tensor& logits, const Tensor& row_max) override {
    ops::classifier_row_max(F(logits), F(row_max), rows(logits), cols(logits));
  }
  void classifier_row_sums(const Tensor& logits, const Tensor& row_max, const Tensor& tokens, int B, int T,
                           int64_t vocab_begin, const Tensor& sums) override {
    ops::classifier_row_sums(F(logits), F(row_max), ids(tokens) + 1, B, T, cols(logits), cols(tokens),
                             static_cast<int>(vocab_begin), F(sums));
  }
  void classifier_finish(const Tensor& logits, const Tensor& losses, const Tensor& row_max, const Tensor& sums,
                         const Tensor& tokens, int B, int T, int64_t vocab_begin, float dscale) override {
    ops::classifier_parallel_finish(F(logits), F(losses), F(row_max), F(sums), ids(tokens) + 1, B, T, cols(logits),
                                    cols(tokens), static_cast<int>(vocab_begin), dscale);
  }

  void adamw(const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad, const Tensor& weights,
             const ops::AdamWHyper& h) override {
    const size_t n = master.numel();
    YUAN_CHECK(m.numel() == n && v.numel() == n && grad.numel() == n && (!weights || weights.numel() == n),
               "cpu ops: adamw of %zu values with moments, gradient or weights of other sizes", n);
    ops::adamw_update(F(master), F(m), F(v), F(grad), nullptr, n, h);
    if (weights && weights.data != master.data) std::memcpy(F(weights), F(master), n * sizeof(float));
  }
  double sum_squares(const Tensor& x) override { return ops::sum_squares(F(x), x.numel()); }
  void add(const Tensor& dst, const Tensor& src) override {
    YUAN_CHECK(src.numel() == dst.numel(), "cpu ops: add of %zu values into %zu", src.numel(), dst.numel());
    ops::add(F(dst), F(src), dst.numel());
  }

 private:
  // Host scratch for the GELU backward's intermediate product, grown to the largest one asked for.
  float* scratch(size_t n) {
    if (scratch_.size() < n) scratch_ = HostArray<float>(n, Mem::Activations);
    return scratch_.data();
  }
  HostArray<float> scratch_;
};

size_t cpu_attention_state(int B, int T, int NH) { return attention_matrix(B, T, NH); }
// One attention (the reference): the gradient of the probabilities, whatever the path.
size_t cpu_attention_scratch(int B, int T, int NH, int, AttentionPath) { return attention_matrix(B, T, NH); }
int64_t dense_logits(int V) { return V; }
size_t token_rows(int B, int T) { return static_cast<size_t>(B) * (T + 1); }
// The GELU backward's intermediate product: [B*T, 4C] fp32.
size_t gelu_scratch_bytes(int C, int B, int T) { return static_cast<size_t>(B) * T * 4 * C * sizeof(float); }

}  // namespace

const TensorFormats& cpu_tensor_formats() {
  // Backward keeps the attention probabilities [B, NH, T, T] and needs as much scratch for their gradient.
  static const TensorFormats f{DType::F32, DType::F32, cpu_attention_state, cpu_attention_scratch, dense_logits,
                               token_rows, gelu_scratch_bytes};
  return f;
}

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace yuan
