// cuDNN's fused attention (cuda/cudnn_attention.cpp) against src/ops/attention.cpp, beyond what the op conformance
// test covers (the attention rows on both paths): a head size only cuDNN takes (256), a backward that repeats bit
// for bit (the deterministic algorithm), and the three integration faults the emulated cuDNN must report, planted
// one at a time into the graphs (CudnnGraphFaults): a stride given for the wrong layout, the causal mask left out,
// the logsumexp not passed to the backward. Each must give a result far outside the tolerance, or cuDNN's refusal.
// On a GPU these run against the real cuDNN, which must answer the same.
// Tolerances as tests/cuda/test_attention.cu's: out 1e-2, dq, dk, dv 2e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "cudnn_attention.h"
#include "gpu_test.h"
#include "ops/reference_ops.h"

namespace {

using namespace yuan::test;
using yuan::gpu::bf16;
namespace gpu = yuan::gpu;
namespace ops = yuan::ops;

#define YUAN_REQUIRE_CUDNN(head_size)                                                            \
  do {                                                                                           \
    YUAN_REQUIRE_GPU();                                                                          \
    const std::string why_ = gpu::cudnn_attention_problem(head_size, 2);                        \
    if (!why_.empty()) GTEST_SKIP() << "no cuDNN attention here: " << why_;                      \
  } while (0)

bf16* B16(DevArray<uint16_t>& a) { return reinterpret_cast<bf16*>(a.get()); }

// One shape's inputs, the CPU reference's outputs and gradients, and device buffers for cuDNN's.
struct Problem {
  int B, T, NH, hs, C;
  size_t BT;
  std::vector<float> qkv, dout, out, dqkv;
  DevArray<uint16_t> d_qkv, d_dout, d_out, d_dqkv;
  DevArray<float> d_lse;
  DevArray<char> work;

  Problem(int b, int t, int nh, int h)
      : B(b), T(t), NH(nh), hs(h), C(nh * h), BT(static_cast<size_t>(b) * t),
        qkv(round_bf16(randn(BT * 3 * C, 1.0f, 7 + t))), dout(round_bf16(randn(BT * C, 1.0f, 8 + t))),
        out(BT * C), dqkv(BT * 3 * C, 0.0f), d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(BT * C),
        d_dqkv(BT * 3 * C), d_lse(BT * NH), work(gpu::cudnn_attention_workspace_bytes(B, T, C, NH)) {
    const size_t n_att = static_cast<size_t>(B) * NH * T * T;
    std::vector<float> att(n_att), datt(n_att);
    ops::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    ops::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  }
  void forward(const gpu::CudnnGraphFaults& f = {}) {
    gpu::cudnn_attention_forward(B16(d_out), d_lse.get(), B16(d_qkv), B, T, C, NH, work.get(), work.size(), 0, f);
  }
  void backward(const gpu::CudnnGraphFaults& f = {}) {
    gpu::cudnn_attention_backward(B16(d_dqkv), B16(d_dout), B16(d_qkv), B16(d_out), d_lse.get(), B, T, C, NH,
                                  work.get(), work.size(), 0, f);
  }
  double out_err() const { return rel_err(from_bf16(d_out.download()), out); }
  double dqkv_err() const { return rel_err(from_bf16(d_dqkv.download()), dqkv); }
};

TEST(CudnnAttention, HeadSize256MatchesCpu) {
  YUAN_REQUIRE_CUDNN(256);
  Problem p(1, 19, 2, 256);
  p.forward();
  EXPECT_LT(p.out_err(), 1e-2);
  p.backward();
  EXPECT_LT(p.dqkv_err(), 2e-2);
}

TEST(CudnnAttention, BackwardRepeatsBitForBit) {
  YUAN_REQUIRE_CUDNN(32);
  Problem p(2, 70, 2, 32);
  p.forward();
  p.backward();
  const std::vector<uint16_t> first = p.d_dqkv.download();
  p.backward();
  EXPECT_EQ(p.d_dqkv.download(), first);
  EXPECT_LT(p.dqkv_err(), 2e-2);
}

// What a faulty graph gives: its error's message when cuDNN refuses it, else "" and the result is checked.
std::string refusal(const std::function<void()>& run) {
  try {
    run();
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const yuan::Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudnnAttention, PlantedFaultsAreReported) {
  YUAN_REQUIRE_CUDNN(16);
  // 4 heads of 16 over 24 positions: the swapped strides stay inside qkv (they read other heads' and positions'
  // values, not past the end), so the fault shows in the numbers.
  Problem p(2, 24, 4, 16);
  p.forward();
  ASSERT_LT(p.out_err(), 1e-2) << "the graph without faults";
  p.backward();
  ASSERT_LT(p.dqkv_err(), 2e-2) << "the graph without faults";

  gpu::CudnnGraphFaults strides;
  strides.head_time_strides_swapped = true;
  if (const std::string why = refusal([&] { p.forward(strides); }); why.empty()) {
    EXPECT_GT(p.out_err(), 0.1) << "Q, K, V read with [B, T, NH, hs] strides pass for [B, NH, T, hs]";
  }

  gpu::CudnnGraphFaults mask;
  mask.no_causal_mask = true;
  if (const std::string why = refusal([&] { p.forward(mask); }); why.empty()) {
    EXPECT_GT(p.out_err(), 0.1) << "attention that sees the future passes for causal";
  }

  gpu::CudnnGraphFaults stats;
  stats.no_stats_to_backward = true;
  p.forward();
  const std::string why = refusal([&] { p.backward(stats); });
  if (why.empty()) {
    EXPECT_GT(p.dqkv_err(), 0.1) << "a backward without the forward's logsumexp passes";
  } else {
    EXPECT_NE(why.find("cuDNN"), std::string::npos) << why;
  }
}

}  // namespace
