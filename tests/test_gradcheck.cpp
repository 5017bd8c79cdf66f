// Finite-difference checks of every backward in ops/reference_ops.h. Each op gets tiny odd shapes and the loss
// L = sum(out * R) for a fixed random R, so dL/dout = R; the analytic gradient of every input and parameter is
// compared with central differences (L(x+h) - L(x-h)) / 2h.
//
// Tolerance: the ops are float32. L is accumulated in double, but each output carries ~1e-7 relative rounding,
// so a difference quotient with h = 1e-3 has absolute error ~1e-7 * sqrt(#outputs) * |out| / 1e-3 ~ 1e-4..1e-3
// relative to O(1) gradients, and the truncation error is O(h^2) ~ 1e-6. We therefore require
// max|analytic - numeric| <= 1e-2 * max|numeric| over each tensor (relative to the tensor's scale, since single
// elements may be ~0). Wrong indexing, a missing term or a factor error shows up as O(1).
//
// Gradient buffers are pre-filled with random values and the fill is subtracted afterwards, which also checks
// that backward ADDS into them (the contract of reference_ops.h) instead of overwriting.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ops/reference_ops.h"
#include "util/rng.h"

namespace {

using Vec = std::vector<float>;
namespace ops = yuan::ops;

constexpr float kStep = 1e-3f;
constexpr double kTol = 1e-2;

Vec randn(size_t n, uint64_t stream, float std = 1.0f) {
  Vec v(n);
  yuan::Rng(42, stream).fill_normal(v.data(), n, std);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central differences of loss() with respect to every element of x (restored afterwards). The step actually
// taken is measured in float, so representation error of x +- h does not bias the quotient.
std::vector<double> numeric_grad(Vec& x, const std::function<double()>& loss) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const float x0 = x[i], xp = x0 + kStep, xm = x0 - kStep;
    x[i] = xp;
    double lp = loss();
    x[i] = xm;
    double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (static_cast<double>(xp) - xm);
  }
  return g;
}

// A gradient buffer pre-filled with noise; grad() is what backward added.
struct GradBuf {
  Vec buf, fill;
  GradBuf(size_t n, uint64_t stream) : buf(randn(n, stream)), fill(buf) {}
  float* data() { return buf.data(); }
  std::vector<double> grad() const {
    std::vector<double> g(buf.size());
    for (size_t i = 0; i < g.size(); i++) g[i] = static_cast<double>(buf[i]) - fill[i];
    return g;
  }
};

void expect_grad_close(const std::string& what, const std::vector<double>& analytic,
                       const std::vector<double>& numeric) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < numeric.size(); i++) {
    scale = std::max(scale, std::fabs(numeric[i]));
    double e = std::fabs(analytic[i] - numeric[i]);
    if (e > err) err = e, worst = i;
  }
  ASSERT_GT(scale, 1e-3) << what << ": numeric gradient is ~0, the check would be vacuous";
  EXPECT_LE(err, kTol * scale) << what << ": worst element " << worst << " analytic " << analytic[worst]
                               << " numeric " << numeric[worst] << " (tensor scale " << scale << ")";
}

TEST(Gradcheck, Encoder) {
  const int B = 2, T = 3, C = 5, V = 4, stride = T + 1;  // rows of T+1 tokens, as the trainer passes them
  // Token 1 appears three times: its wte row must collect all three gradients.
  std::vector<int32_t> tok = {1, 3, 1, 9, 0, 1, 2, 9};
  Vec wte = randn(V * C, 1), wpe = randn(T * C, 2), R = randn(B * T * C, 3), out(B * T * C);
  auto loss = [&] {
    ops::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, stride);
    return dot(out, R);
  };
  loss();
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        EXPECT_EQ(out[(b * T + t) * C + c], wte[tok[b * stride + t] * C + c] + wpe[t * C + c]);
  GradBuf dwte(wte.size(), 4), dwpe(wpe.size(), 5);
  ops::encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C, stride);
  expect_grad_close("encoder dwte", dwte.grad(), numeric_grad(wte, loss));
  expect_grad_close("encoder dwpe", dwpe.grad(), numeric_grad(wpe, loss));
}

TEST(Gradcheck, LayerNorm) {
  const int N = 4, C = 9;
  Vec inp = randn(N * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3), R = randn(N * C, 4);
  for (float& x : inp) x += 0.7f;  // a non-zero mean, so mean subtraction matters
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ops::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  GradBuf dinp(inp.size(), 5), dw(C, 6), db(C, 7);
  ops::layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  expect_grad_close("layernorm dinp", dinp.grad(), numeric_grad(inp, loss));
  expect_grad_close("layernorm dw", dw.grad(), numeric_grad(w, loss));
  expect_grad_close("layernorm db", db.grad(), numeric_grad(b, loss));
}

// Its backward is the identity into both branches, which the backend does by passing dout on.
TEST(Gradcheck, Residual) {
  Vec a = randn(11, 1), b = randn(11, 2), out(11);
  ops::residual_forward(out.data(), a.data(), b.data(), out.size());
  for (size_t i = 0; i < out.size(); i++) EXPECT_EQ(out[i], a[i] + b[i]) << i;
}

TEST(Gradcheck, Matmul) {
  const int N = 5, C = 7, OC = 6;
  Vec inp = randn(N * C, 1), w = randn(OC * C, 2), bias = randn(OC, 3), R = randn(N * OC, 4), out(N * OC);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    auto loss = [&] {
      ops::matmul_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
      return dot(out, R);
    };
    loss();
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) {
        double ref = with_bias ? bias[o] : 0.0;
        for (int c = 0; c < C; c++) ref += static_cast<double>(inp[n * C + c]) * w[o * C + c];
        EXPECT_NEAR(out[n * OC + o], ref, 1e-5) << "out[" << n << "," << o << "]";
      }
    GradBuf dinp(inp.size(), 5), dw(w.size(), 6), dbias(OC, 7);
    ops::matmul_backward(dinp.data(), dw.data(), with_bias ? dbias.data() : nullptr, R.data(), inp.data(),
                         w.data(), N, C, OC);
    expect_grad_close("matmul dinp", dinp.grad(), numeric_grad(inp, loss));
    expect_grad_close("matmul dw", dw.grad(), numeric_grad(w, loss));
    if (with_bias) expect_grad_close("matmul dbias", dbias.grad(), numeric_grad(bias, loss));
  }
}

TEST(Gradcheck, Attention) {
  const int B = 2, T = 5, C = 8, NH = 2;
  Vec qkv = randn(B * T * 3 * C, 1), R = randn(B * T * C, 2), out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    ops::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  loss();
  // Causal: every row of att is a distribution over positions <= t.
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++) {
      double sum = 0;
      for (int s = 0; s < T; s++) {
        float a = att[(bh * T + t) * T + s];
        if (s > t) {
          EXPECT_EQ(a, 0.0f) << "att sees the future at t=" << t << " s=" << s;
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  GradBuf dqkv(qkv.size(), 3);
  Vec datt(att.size());
  ops::attention_backward(dqkv.data(), datt.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_grad_close("attention dqkv", dqkv.grad(), numeric_grad(qkv, loss));
}

TEST(Gradcheck, Gelu) {
  const size_t n = 37;
  Vec inp = randn(n, 1, 2.0f), R = randn(n, 2), out(n);
  auto loss = [&] {
    ops::gelu_forward(out.data(), inp.data(), n);
    return dot(out, R);
  };
  loss();
  for (size_t i = 0; i < n; i++) {
    double x = inp[i];
    double ref = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], ref, 1e-6) << "gelu(" << x << ")";
  }
  GradBuf dinp(n, 3);
  ops::gelu_backward(dinp.data(), inp.data(), R.data(), n);
  expect_grad_close("gelu dinp", dinp.grad(), numeric_grad(inp, loss));
}

TEST(Gradcheck, Classifier) {
  const int B = 2, T = 3, V = 11, stride = T + 1;
  std::vector<int32_t> targets = {4, 0, 10, -1, 7, 7, 2, -1};  // -1: the column a stride must skip
  Vec logits = randn(B * T * V, 1, 2.0f), losses(B * T), work(logits.size());
  const float scale = 1.0f / (B * T);  // the mean loss, as the backend uses it
  // The loss the gradient belongs to: scale * sum of per-row losses. Works on a copy, since a call with
  // dlogits_scale != 0 overwrites the logits.
  auto loss = [&] {
    work = logits;
    ops::classifier_forward_backward(work.data(), losses.data(), targets.data(), B, T, V, stride, 0.0f);
    double s = 0;
    for (float l : losses) s += l;
    return scale * s;
  };
  loss();
  EXPECT_EQ(work, logits) << "dlogits_scale = 0 must leave the logits alone";
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* row = &logits[(b * T + t) * V];
      double mx = row[0], sum = 0;
      for (int v = 0; v < V; v++) mx = std::max(mx, static_cast<double>(row[v]));
      for (int v = 0; v < V; v++) sum += std::exp(row[v] - mx);
      EXPECT_NEAR(losses[b * T + t], mx + std::log(sum) - row[targets[b * stride + t]], 1e-5);
    }
  Vec dlogits = logits;
  ops::classifier_forward_backward(dlogits.data(), losses.data(), targets.data(), B, T, V, stride, scale);
  std::vector<double> analytic(dlogits.begin(), dlogits.end());
  expect_grad_close("classifier dlogits", analytic, numeric_grad(logits, loss));
}

}  // namespace
