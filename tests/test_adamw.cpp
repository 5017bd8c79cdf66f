// The CPU AdamW kernel against a scalar double-precision transcription of the formula, and against
// torch.optim.AdamW + clip_grad_norm_ (tests/data/adamw_ref.txt, written by tools/make_adamw_fixture.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "util/dtype.h"

namespace yuan {
namespace {

float pattern(size_t i, int salt) {  // deterministic values in [-1, 1)
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(salt) << 40);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(x % 2000001) / 1000000.0f - 1.0f;
}

struct DoubleState {
  std::vector<double> p, m, v;
};

void reference_step(DoubleState& s, const std::vector<float>& g, const ops::AdamWHyper& h) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.t));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.t));
  for (size_t i = 0; i < g.size(); i++) {
    double gi = static_cast<double>(g[i]) * h.grad_scale;
    s.p[i] *= 1 - h.lr * h.weight_decay;
    s.m[i] = h.beta1 * s.m[i] + (1 - h.beta1) * gi;
    s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * gi * gi;
    s.p[i] -= h.lr / bc1 * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps);
  }
}

// Relative error against max(|want|, scale): m passes through zero by cancellation, where only its error relative
// to the gradients' size (fp32 rounding of terms of that size) is meaningful.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double scale, const char* what) {
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], 1e-6 * std::max(std::abs(want[i]), scale)) << what << "[" << i << "]";
}

TEST(AdamW, MatchesDoubleReference) {
  // Odd sizes cover the SIMD remainder; the large one runs the OpenMP path.
  for (size_t n : {size_t(1), size_t(1003), size_t(200003)}) {
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
    DoubleState ref{std::vector<double>(n), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    for (size_t i = 0; i < n; i++) ref.p[i] = p[i] = pattern(i, 1);
    ops::AdamWHyper h;
    h.beta1 = 0.9;
    h.beta2 = 0.95;
    h.weight_decay = 0.1;
    for (int t = 1; t <= 5; t++) {
      for (size_t i = 0; i < n; i++) g[i] = pattern(i, 10 + t) * (t == 3 ? 1e-3f : 0.5f);
      h.t = t;
      h.lr = 1e-2 / t;
      h.grad_scale = t % 2 ? 0.7 : 1.0;
      ops::adamw_update(p.data(), m.data(), v.data(), g.data(), nullptr, n, h);
      reference_step(ref, g, h);
    }
    expect_close(p, ref.p, 1e-2, "p");
    expect_close(m, ref.m, 0.5, "m");  // |g| <= 0.5
    expect_close(v, ref.v, 0.0, "v");
  }
}

TEST(AdamW, Bf16CopyIsTheRoundedResult) {
  const size_t n = 70001;
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; i++) {
    p[i] = pattern(i, 2) * 3;
    m[i] = pattern(i, 3) * 0.01f;
    v[i] = std::abs(pattern(i, 4)) * 1e-4f;
    g[i] = pattern(i, 5);
  }
  std::vector<uint16_t> bf(n, 0xFFFF);
  ops::AdamWHyper h;
  h.lr = 1e-3;
  h.t = 7;
  ops::adamw_update(p.data(), m.data(), v.data(), g.data(), bf.data(), n, h);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(bf[i], f32_to_bf16(p[i])) << i;
}

TEST(AdamW, GradScaleEqualsPrescaledGradient) {
  const size_t n = 4099;
  const float s = 0.3125f;
  std::vector<float> p1(n), m1(n, 0.0f), v1(n, 0.0f), g(n), gs(n);
  for (size_t i = 0; i < n; i++) {
    p1[i] = pattern(i, 6);
    g[i] = pattern(i, 7);
    gs[i] = g[i] * s;
  }
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  ops::AdamWHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.05;
  for (int t = 1; t <= 3; t++) {
    h.t = t;
    h.grad_scale = s;
    ops::adamw_update(p1.data(), m1.data(), v1.data(), g.data(), nullptr, n, h);
    h.grad_scale = 1;
    ops::adamw_update(p2.data(), m2.data(), v2.data(), gs.data(), nullptr, n, h);
  }
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * sizeof(float)));
}

TEST(AdamW, SumSquaresAccumulatesInDouble) {
  // 2^24 + k ones: an fp32 accumulator would stop counting at 2^24.
  const size_t n = (size_t(1) << 24) + 1001;
  std::vector<float> x(n, 1.0f);
  x[5] = 3.0f;
  EXPECT_EQ(ops::sum_squares(x.data(), n), static_cast<double>(n) + 8.0);
  EXPECT_EQ(ops::sum_squares(x.data(), 0), 0.0);
}

// Expects `key` next and returns the rest of the line's numbers.
std::vector<double> read_row(std::ifstream& in, const std::string& key) {
  std::string line;
  do {
    std::getline(in, line);
  } while (in && (line.empty() || line[0] == '#'));
  std::istringstream ss(line);
  std::string k;
  ss >> k;
  EXPECT_EQ(k, key) << "adamw_ref.txt";
  std::vector<double> out;
  for (double x; ss >> x;) out.push_back(x);
  return out;
}

TEST(AdamW, MatchesPyTorchFixture) {
  const std::string path = std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/') + 1) + "data/adamw_ref.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path << " (tools/make_adamw_fixture.py writes it)";
  std::vector<double> hyper = read_row(in, "hyper"), sizes = read_row(in, "sizes"), init = read_row(in, "init");
  ASSERT_EQ(hyper.size(), 5u);
  ASSERT_EQ(sizes.size(), 2u);
  const size_t n_decay = static_cast<size_t>(sizes[0]), n = n_decay + static_cast<size_t>(sizes[1]);
  ASSERT_EQ(init.size(), n);
  std::vector<float> p(init.begin(), init.end()), m(n, 0.0f), v(n, 0.0f);
  ops::AdamWHyper h;
  h.beta1 = hyper[0];
  h.beta2 = hyper[1];
  h.eps = hyper[2];
  const double clip = hyper[4];
  for (int t = 1; t <= 3; t++) {
    std::vector<double> row = read_row(in, "grad");
    ASSERT_EQ(row.size(), n + 1);
    std::vector<float> g(row.begin() + 1, row.end());
    double norm = std::sqrt(ops::sum_squares(g.data(), n));
    EXPECT_NEAR(norm, read_row(in, "norm").at(0), 1e-6 * norm) << "step " << t;
    h.t = t;
    h.lr = row[0];
    h.grad_scale = norm > clip ? clip / (norm + 1e-6) : 1.0;
    h.weight_decay = hyper[3];
    ops::adamw_update(p.data(), m.data(), v.data(), g.data(), nullptr, n_decay, h);
    h.weight_decay = 0;
    ops::adamw_update(p.data() + n_decay, m.data() + n_decay, v.data() + n_decay, g.data() + n_decay, nullptr,
                      n - n_decay, h);
  }
  std::vector<double> want = read_row(in, "final");
  ASSERT_EQ(want.size(), n);
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(p[i], want[i], 1e-6 * std::abs(want[i])) << "param " << i;
}

}  // namespace
}  // namespace yuan
