// The CPU reference backend: fp32 weights, gradients and activations in host memory, ops from src/ops.
#include "backend/cpu_backend.h"
#include "backend/host_backend.h"

#include <algorithm>
#include <cstring>

#include "ops/ops.h"
#include "util/error.h"
#include "util/memory.h"

namespace yuan {
namespace {

// Activations of one micro-batch, kept from forward for backward. Sized for B x seq_len; shorter T reuses them.
struct Activations {
  Activations(const GPTConfig& c, int B) {
    const size_t BT = static_cast<size_t>(B) * c.seq_len, C = c.n_embd, L = c.n_layer;
    auto arr = [](size_t n) { return HostArray<float>(n, Mem::Activations); };
    encoded = arr(BT * C);
    ln1 = arr(L * BT * C), ln1_mean = arr(L * BT), ln1_rstd = arr(L * BT);
    qkv = arr(L * BT * 3 * C);
    att = arr(L * static_cast<size_t>(B) * c.n_head * c.seq_len * c.seq_len);
    atty = arr(L * BT * C), attproj = arr(L * BT * C), res2 = arr(L * BT * C);
    ln2 = arr(L * BT * C), ln2_mean = arr(L * BT), ln2_rstd = arr(L * BT);
    fch = arr(L * BT * 4 * C), fch_gelu = arr(L * BT * 4 * C), fcproj = arr(L * BT * C), res3 = arr(L * BT * C);
    lnf = arr(BT * C), lnf_mean = arr(BT), lnf_rstd = arr(BT);
    logits = arr(BT * c.vocab_size), losses = arr(BT);
    // backward scratch, reused by every layer
    dres = arr(BT * C), dln = arr(BT * C), datty = arr(BT * C), dqkv = arr(BT * 3 * C);
    datt = arr(static_cast<size_t>(B) * c.n_head * c.seq_len * c.seq_len);
    dfch = arr(BT * 4 * C), dfch_gelu = arr(BT * 4 * C);
  }
  HostArray<float> encoded, ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch,
      fch_gelu, fcproj, res3, lnf, lnf_mean, lnf_rstd, logits, losses;
  HostArray<float> dres, dln, datty, dqkv, datt, dfch, dfch_gelu;
};

class CpuBackend final : public HostBackend {
 public:
  CpuBackend(const GPTConfig& c, int micro_batch, size_t padded)
      : HostBackend(c, padded), B_(micro_batch), acts_(c, micro_batch) {}
  const char* name() const override { return "cpu"; }
  int max_micro_batch() const override { return B_; }

  float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) override {
    const int T = layout_.config().seq_len;
    forward(tokens, B, T, T + 1);
    float loss = classify(tokens + 1, B, T, T + 1, grad_scale / (static_cast<float>(B) * T));
    backward(tokens, B, T, T + 1, ready);
    return loss;
  }

  float forward_loss(const int32_t* tokens, int B) override {
    const int T = layout_.config().seq_len;
    forward(tokens, B, T, T + 1);
    return classify(tokens + 1, B, T, T + 1, 0.0f);
  }

  void forward_logits(const int32_t* ids, int len, float* logits) override {
    YUAN_CHECK(len >= 1 && len <= layout_.config().seq_len, "forward_logits: length %d outside [1, seq_len=%d]", len,
               layout_.config().seq_len);
    forward(ids, 1, len, len);
    std::memcpy(logits, acts_.logits.data(), static_cast<size_t>(len) * layout_.config().vocab_size * sizeof(float));
  }

 private:
  const float* P(const TensorSpec& t) const { return params_.data() + t.offset; }
  float* G(const TensorSpec& t) { return grads_.data() + t.offset; }

  // Row b of `tok` starts at b * stride; positions [0, T) are the inputs.
  void forward(const int32_t* tok, int B, int T, int stride) {
    const GPTConfig& c = layout_.config();
    YUAN_CHECK(B >= 1 && B <= B_, "backend: micro-batch %d outside [1, %d]", B, B_);
    check_token_ids(tok, B, stride, c.vocab_size);
    const int C = c.n_embd, NH = c.n_head;
    const size_t BT = static_cast<size_t>(B) * T, BTC = BT * C;
    Activations& a = acts_;
    ops::encoder_forward(a.encoded.data(), tok, P(layout_.wte()), P(layout_.wpe()), B, T, C, stride);
    const float* x = a.encoded.data();
    for (int l = 0; l < c.n_layer; l++) {
      const size_t lo = l * full_BTC(), lr = l * full_BT();
      float *ln1 = a.ln1.data() + lo, *qkv = a.qkv.data() + 3 * lo, *atty = a.atty.data() + lo;
      float *proj = a.attproj.data() + lo, *res2 = a.res2.data() + lo, *ln2 = a.ln2.data() + lo;
      float *fch = a.fch.data() + 4 * lo, *fchg = a.fch_gelu.data() + 4 * lo, *fcp = a.fcproj.data() + lo;
      float* res3 = a.res3.data() + lo;
      ops::layernorm_forward(ln1, a.ln1_mean.data() + lr, a.ln1_rstd.data() + lr, x, P(layout_.block(l, kLn1W)),
                             P(layout_.block(l, kLn1B)), BT, C);
      ops::matmul_forward(qkv, ln1, P(layout_.block(l, kQkvW)), P(layout_.block(l, kQkvB)), BT, C, 3 * C);
      ops::attention_forward(atty, att_at(l), qkv, B, T, C, NH);
      ops::matmul_forward(proj, atty, P(layout_.block(l, kAttnProjW)), P(layout_.block(l, kAttnProjB)), BT, C, C);
      ops::residual_forward(res2, x, proj, BTC);
      ops::layernorm_forward(ln2, a.ln2_mean.data() + lr, a.ln2_rstd.data() + lr, res2, P(layout_.block(l, kLn2W)),
                             P(layout_.block(l, kLn2B)), BT, C);
      ops::matmul_forward(fch, ln2, P(layout_.block(l, kFcW)), P(layout_.block(l, kFcB)), BT, C, 4 * C);
      ops::gelu_forward(fchg, fch, BT * 4 * C);
      ops::matmul_forward(fcp, fchg, P(layout_.block(l, kFcProjW)), P(layout_.block(l, kFcProjB)), BT, 4 * C, C);
      ops::residual_forward(res3, res2, fcp, BTC);
      x = res3;
    }
    ops::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, P(layout_.ln_f_w()),
                           P(layout_.ln_f_b()), BT, C);
    ops::matmul_forward(a.logits.data(), a.lnf.data(), P(layout_.wte()), nullptr, BT, C, c.vocab_size);
  }

  // Mean loss over the B*T targets; with dscale != 0 the logits become dloss/dlogits * dscale*B*T.
  float classify(const int32_t* targets, int B, int T, int stride, float dscale) {
    ops::classifier_forward_backward(acts_.logits.data(), acts_.losses.data(), targets, B, T,
                                     layout_.config().vocab_size, stride, dscale);
    double sum = 0;
    for (size_t i = 0; i < static_cast<size_t>(B) * T; i++) sum += acts_.losses[i];
    return static_cast<float>(sum / (static_cast<double>(B) * T));
  }

  void backward(const int32_t* tok, int B, int T, int stride, const ModuleReadyFn& ready) {
    const GPTConfig& c = layout_.config();
    const int C = c.n_embd, NH = c.n_head, L = c.n_layer;
    const size_t BT = static_cast<size_t>(B) * T, BTC = BT * C;
    Activations& a = acts_;
    auto zero = [](HostArray<float>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(float)); };
    const int n_modules = static_cast<int>(layout_.modules().size());

    zero(a.dln, BTC);
    ops::matmul_backward(a.dln.data(), G(layout_.wte()), nullptr, a.logits.data(), a.lnf.data(), P(layout_.wte()), BT,
                         C, c.vocab_size);
    zero(a.dres, BTC);
    const float* x_last = L > 0 ? a.res3.data() + (L - 1) * full_BTC() : a.encoded.data();
    ops::layernorm_backward(a.dres.data(), G(layout_.ln_f_w()), G(layout_.ln_f_b()), a.dln.data(), x_last,
                            P(layout_.ln_f_w()), a.lnf_mean.data(), a.lnf_rstd.data(), BT, C);
    if (ready) ready(n_modules - 1);

    for (int l = L - 1; l >= 0; l--) {
      const size_t lo = l * full_BTC(), lr = l * full_BT();
      const float* x = l == 0 ? a.encoded.data() : a.res3.data() + (l - 1) * full_BTC();
      // residual3 = res2 + fcproj: dres flows unchanged into both
      zero(a.dfch_gelu, BT * 4 * C);
      ops::matmul_backward(a.dfch_gelu.data(), G(layout_.block(l, kFcProjW)), G(layout_.block(l, kFcProjB)),
                           a.dres.data(), a.fch_gelu.data() + 4 * lo, P(layout_.block(l, kFcProjW)), BT, 4 * C, C);
      zero(a.dfch, BT * 4 * C);
      ops::gelu_backward(a.dfch.data(), a.fch.data() + 4 * lo, a.dfch_gelu.data(), BT * 4 * C);
      zero(a.dln, BTC);
      ops::matmul_backward(a.dln.data(), G(layout_.block(l, kFcW)), G(layout_.block(l, kFcB)), a.dfch.data(),
                           a.ln2.data() + lo, P(layout_.block(l, kFcW)), BT, C, 4 * C);
      ops::layernorm_backward(a.dres.data(), G(layout_.block(l, kLn2W)), G(layout_.block(l, kLn2B)), a.dln.data(),
                              a.res2.data() + lo, P(layout_.block(l, kLn2W)), a.ln2_mean.data() + lr,
                              a.ln2_rstd.data() + lr, BT, C);
      // res2 = x + attproj
      zero(a.datty, BTC);
      ops::matmul_backward(a.datty.data(), G(layout_.block(l, kAttnProjW)), G(layout_.block(l, kAttnProjB)),
                           a.dres.data(), a.atty.data() + lo, P(layout_.block(l, kAttnProjW)), BT, C, C);
      zero(a.dqkv, BT * 3 * C);
      ops::attention_backward(a.dqkv.data(), a.datt.data(), a.datty.data(), a.qkv.data() + 3 * lo, att_at(l), B, T,
                              C, NH);
      zero(a.dln, BTC);
      ops::matmul_backward(a.dln.data(), G(layout_.block(l, kQkvW)), G(layout_.block(l, kQkvB)), a.dqkv.data(),
                           a.ln1.data() + lo, P(layout_.block(l, kQkvW)), BT, C, 3 * C);
      ops::layernorm_backward(a.dres.data(), G(layout_.block(l, kLn1W)), G(layout_.block(l, kLn1B)), a.dln.data(), x,
                              P(layout_.block(l, kLn1W)), a.ln1_mean.data() + lr, a.ln1_rstd.data() + lr, BT, C);
      if (ready) ready(layout_.block(l, kLn1W).module);
    }
    ops::encoder_backward(G(layout_.wte()), G(layout_.wpe()), a.dres.data(), tok, B, T, C, stride);
    if (ready) {
      ready(layout_.wpe().module);
      ready(layout_.wte().module);
    }
  }

  // Per-layer activation strides use the allocation's shape (B_ x seq_len), whatever B and T this call uses.
  size_t full_BT() const { return static_cast<size_t>(B_) * layout_.config().seq_len; }
  size_t full_BTC() const { return full_BT() * layout_.config().n_embd; }
  float* att_at(int l) {
    const GPTConfig& c = layout_.config();
    return acts_.att.data() + l * static_cast<size_t>(B_) * c.n_head * c.seq_len * c.seq_len;
  }

  int B_;
  Activations acts_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const GPTConfig& cfg, int micro_batch, size_t padded_size) {
  return std::make_unique<CpuBackend>(cfg, micro_batch, padded_size);
}

}  // namespace yuan
