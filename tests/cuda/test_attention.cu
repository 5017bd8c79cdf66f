// The flash-attention kernels against src/ops/attention.cpp (which stores the full [T,T] matrix) on random
// bf16 q, k, v, at every padded head size and at lengths that are not multiples of the 64-row tile.
// Tolerances: out 1e-2 (P is rounded to bf16 before P V, and out is bf16); lse 1e-3 absolute per row (fp32 from
// the same inputs; exp2/log2 approximations); dq, dk, dv 2e-2 (P and dS enter the tensor cores as bf16, and
// delta = rowsum(dO * O) uses the bf16 O).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention.cuh"
#include "gpu_test.h"
#include "ops/reference_ops.h"

namespace {

using namespace yuan::test;
using yuan::gpu::bf16;
namespace gpu = yuan::gpu;
namespace ops = yuan::ops;

struct Shape {
  int B, T, NH, hs;
};

class CudaAttention : public testing::TestWithParam<Shape> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  YUAN_REQUIRE_GPU();
  const Shape s = GetParam();
  const int C = s.NH * s.hs;
  const size_t BT = static_cast<size_t>(s.B) * s.T, n_att = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  // q, k of std 1 make scores of std ~sqrt(hs)/sqrt(hs) = 1 after scaling: peaked enough to test the softmax.
  const auto qkv = round_bf16(randn(BT * 3 * C, 1.0f, 100 + s.T));
  std::vector<float> out(BT * C), att(n_att);
  ops::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, C, s.NH);

  DevArray<uint16_t> d_qkv(to_bf16(qkv)), d_out(BT * C);
  DevArray<float> d_lse(BT * s.NH);
  gpu::attention_forward(reinterpret_cast<bf16*>(d_out.get()), d_lse.get(), reinterpret_cast<const bf16*>(d_qkv.get()),
                         s.B, s.T, C, s.NH, 0);
  const auto got_out = d_out.download();
  EXPECT_LT(rel_err(from_bf16(got_out), out), 1e-2) << "out";

  // lse of each row, in double from the same inputs.
  const auto lse = d_lse.download();
  double lse_err = 0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.NH; h++)
      for (int t = 0; t < s.T; t++) {
        const float* q = qkv.data() + (static_cast<size_t>(b) * s.T + t) * 3 * C + h * s.hs;
        double mx = -INFINITY;
        std::vector<double> sc(t + 1);
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = qkv.data() + (static_cast<size_t>(b) * s.T + t2) * 3 * C + C + h * s.hs;
          double d = 0;
          for (int i = 0; i < s.hs; i++) d += static_cast<double>(q[i]) * k[i];
          sc[t2] = d * scale;
          mx = std::max(mx, sc[t2]);
        }
        double sum = 0;
        for (double v : sc) sum += std::exp(v - mx);
        const double ref = mx + std::log(sum), got = lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t];
        lse_err = std::max(lse_err, std::fabs(got - ref) / std::max(1.0, std::fabs(ref)));
      }
  EXPECT_LT(lse_err, 1e-3) << "lse";

  const auto dout = round_bf16(randn(BT * C, 1.0f, 200 + s.T));
  std::vector<float> dqkv(BT * 3 * C, 0.0f), datt(n_att);
  ops::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, C, s.NH);
  DevArray<uint16_t> d_dout(to_bf16(dout));
  DevArray<float> d_delta(BT * s.NH);
  std::vector<uint16_t> first;
  for (int run = 0; run < 2; run++) {
    DevArray<uint16_t> d_dqkv(BT * 3 * C);  // NaN-filled: every element must be written
    gpu::attention_backward(reinterpret_cast<bf16*>(d_dqkv.get()), d_delta.get(),
                            reinterpret_cast<const bf16*>(d_dout.get()), reinterpret_cast<const bf16*>(d_qkv.get()),
                            reinterpret_cast<const bf16*>(d_out.get()), d_lse.get(), s.B, s.T, C, s.NH, 0);
    const auto got = d_dqkv.download();
    if (run == 1) {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 2), 0) << "backward is not deterministic";
      break;
    }
    first = got;
    const auto g = from_bf16(got);
    // q, k, v parts separately: their scales differ.
    const char* part[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
      std::vector<float> a, r;
      for (size_t row = 0; row < BT; row++)
        for (int c = 0; c < C; c++) {
          a.push_back(g[row * 3 * C + p * C + c]);
          r.push_back(dqkv[row * 3 * C + p * C + c]);
        }
      EXPECT_LT(rel_err(a, r), 2e-2) << part[p];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         testing::Values(Shape{2, 64, 2, 64},    // one tile
                                         Shape{1, 200, 3, 64},   // partial last tile, GPT-2 head size
                                         Shape{2, 130, 2, 128},  // head size 128, 32-row backward steps
                                         Shape{1, 100, 2, 32}, Shape{1, 77, 2, 16},
                                         Shape{3, 12, 4, 8},     // the PyTorch fixture's shape: hs 8 padded to 16
                                         Shape{1, 1, 1, 64},     // a single position
                                         Shape{1, 96, 1, 40}),   // head size not a power of two
                         [](const testing::TestParamInfo<Shape>& i) {
                           return "B" + std::to_string(i.param.B) + "_T" + std::to_string(i.param.T) + "_NH" +
                                  std::to_string(i.param.NH) + "_hs" + std::to_string(i.param.hs);
                         });

// The backward's first kernel alone, just past one pass of its grid-stride loop on the target device (270,336 rows
// on the H100 and H200, 221,184 on the A100: docs/EMULATOR.md, "Test shapes"): 271,200 rows of head size 8, whose
// attention would take minutes here. delta = rowsum(dO * O) over each head's channels, summed in double here.
TEST(CudaAttentionDelta, PastOneStrideMatchesTheRowSums) {
  YUAN_REQUIRE_GPU();
  const int B = 8475, T = 16, NH = 2, C = 16, hs = C / NH;
  const size_t n = static_cast<size_t>(B) * T * C, rows = static_cast<size_t>(B) * T * NH;
  const auto dout = round_bf16(randn(n, 1.0f, 31)), out = round_bf16(randn(n, 1.0f, 32));
  DevArray<uint16_t> d_dout(to_bf16(dout)), d_out(to_bf16(out));
  DevArray<float> d_delta(rows);
  gpu::attention_delta(d_delta.get(), reinterpret_cast<const bf16*>(d_dout.get()),
                       reinterpret_cast<const bf16*>(d_out.get()), B, T, C, NH, 0);
  std::vector<double> ref(rows);
  for (size_t bt = 0; bt < static_cast<size_t>(B) * T; bt++)
    for (int h = 0; h < NH; h++) {
      double acc = 0;
      for (int c = 0; c < hs; c++) acc += double(dout[bt * C + h * hs + c]) * out[bt * C + h * hs + c];
      ref[(bt / T * NH + h) * T + bt % T] = acc;
    }
  EXPECT_LT(rel_err(d_delta.download(), ref), 1e-6);
}

}  // namespace
