// The memory plan on the CUDA device (program/program.h) is arithmetic on the CUDA tensor formats, so these run
// without a GPU; the last one compares it with what a backend and a program take from the device.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda_backend.h"
#include "gpu_test.h"
#include "program/program.h"
#include "util/error.h"

namespace {

using yuan::Device;
using yuan::GPTConfig;
using yuan::MemoryPlan;
using yuan::ProgramSpec;

const GPTConfig kSmall{12, 12, 768, 1024, 50257};
const GPTConfig kXl{24, 16, 2048, 2048, 50257};

size_t params(const GPTConfig& c) { return yuan::ParamLayout(c).total(); }
MemoryPlan plan(const GPTConfig& c, int micro_batch, bool recompute) {
  return yuan::plan_memory(Device::Cuda, c, ProgramSpec{{}, micro_batch, 1, recompute}, params(c));
}
void check(const GPTConfig& c, int micro_batch, bool recompute, size_t free_bytes) {
  yuan::check_memory(Device::Cuda, c, ProgramSpec{{}, micro_batch, 1, recompute}, params(c), free_bytes);
}

TEST(CudaMemoryPlan, TensorFormats) {
  const yuan::TensorFormats& f = yuan::tensor_formats(Device::Cuda);
  EXPECT_EQ(f.weights, yuan::DType::BF16);
  EXPECT_EQ(f.activations, yuan::DType::BF16);
  EXPECT_EQ(f.attention_state(3, 100, 12), 3u * 12 * 100) << "the logsumexp per row and head";
  EXPECT_EQ(f.attention_scratch(3, 100, 12, 64, yuan::AttentionPath::Own), 3u * 12 * 100) << "delta";
  // cuDNN's workspace: the deterministic backward's fp32 dQ and softmax sums, twice over (cuda/cudnn_attention.h).
  EXPECT_EQ(f.attention_scratch(3, 100, 12, 64, yuan::AttentionPath::Cudnn), 2u * (3 * 12 * 100 * 64 + 3 * 12 * 100));
  EXPECT_EQ(f.logits_ld(50257), 50304);
  EXPECT_EQ(f.logits_ld(64), 64);
  // The ids, then the embedding backward's grouping: count, offsets, ids and rows (at most one group per row).
  EXPECT_EQ(f.token_slot(4, 10), 4u * 11 + 1 + 41 + 40 + 40);
}

TEST(CudaMemoryPlan, WeightsAndGradsAreBf16AndFp32OfEveryParameter) {
  for (GPTConfig c : {kSmall, kXl, GPTConfig{2, 4, 32, 12, 97}}) {
    const size_t n = params(c);
    const MemoryPlan p = plan(c, 4, false);
    EXPECT_EQ(p.weights, 2 * n);
    EXPECT_EQ(p.grads, 4 * n);
    EXPECT_EQ(p.total(), p.weights + p.grads + p.activations + p.buffers);
  }
  const MemoryPlan stage = yuan::plan_memory(Device::Cuda, kSmall, {{0, 5}, 4, 1, false}, params(kSmall) / 2);
  EXPECT_EQ(stage.weights, 2 * (params(kSmall) / 2)) << "a pipeline stage holds its own modules' parameters";
}

TEST(CudaMemoryPlan, ActivationsMatchTheKeptTensors) {
  // Per token and layer: 16 C bf16 values (ln1, qkv 3C, atty, res2, ln2, fch 4C, fch_gelu 4C, the block output)
  // and 4 + NH fp32 (LayerNorm means and rstds, attention lse); then the embedding, lnf, their stats, the losses
  // and the bf16 logits with rows padded to 50304. Each buffer is rounded up to 256 bytes.
  const GPTConfig c = kSmall;
  const size_t B = 8, BT = B * c.seq_len, C = c.n_embd, L = c.n_layer, Vp = 50304;
  const size_t per_layer = BT * C * 2 * (1 + 3 + 1 + 1 + 1 + 4 + 4 + 1) + BT * 4 * (4 + c.n_head);
  const size_t rest = 2 * BT * C * 2 /*embedding, lnf*/ + 3 * BT * 4 + BT * Vp * 2;
  const size_t expect = L * per_layer + rest;
  const MemoryPlan p = plan(c, static_cast<int>(B), false);
  EXPECT_GE(p.activations, expect);
  EXPECT_LT(p.activations, expect + 256 * (L * 12 + L + 6));
  // GPT-2 small at B=8, T=1024: 2.27 GiB of blocks + 0.77 GiB of logits.
  EXPECT_NEAR(p.activations / 1073741824.0, 3.05, 0.01);
}

TEST(CudaMemoryPlan, RecomputeKeepsOneLayerOfActivations) {
  const MemoryPlan full = plan(kXl, 4, false), re = plan(kXl, 4, true);
  EXPECT_EQ(full.weights, re.weights);
  EXPECT_EQ(full.grads, re.grads);
  EXPECT_EQ(full.buffers, re.buffers);
  EXPECT_LT(re.activations * 5, full.activations) << "recompute should keep ~1/16 of the per-layer activations";
}

TEST(CudaMemoryPlan, ActivationsAndBuffersGrowWithTheMicroBatch) {
  const MemoryPlan one = plan(kSmall, 1, false), two = plan(kSmall, 2, false);
  EXPECT_EQ(one.weights, two.weights);
  EXPECT_NEAR(static_cast<double>(two.activations) / one.activations, 2.0, 0.01);
  EXPECT_GT(two.buffers, one.buffers);
}

TEST(CudaMemoryPlan, CheckFitsOrSaysWhatToTry) {
  const MemoryPlan p = plan(kSmall, 16, false);
  EXPECT_NO_THROW(check(kSmall, 16, false, p.total()));
  const size_t fits_8 = plan(kSmall, 8, false).total();
  try {
    check(kSmall, 16, false, fits_8);
    FAIL() << "no error for a plan of " << p.total() << " bytes in " << fits_8;
  } catch (const yuan::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("memory plan: needs "), 0u) << msg;
    EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("try train.micro_batch=8 or train.recompute=true"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
  try {
    check(kSmall, 1, false, 1 << 20);
    FAIL() << "no error for 1 MiB";
  } catch (const yuan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute=true"), std::string::npos) << e.what();
  }
}

// What the device loses to a backend and a program is the plan, give or take cudaMalloc's rounding and the
// cuBLASLt handle.
TEST(CudaMemoryPlan, BackendAndProgramTakeWhatThePlanSays) {
  YUAN_REQUIRE_GPU();
  const GPTConfig c{4, 8, 512, 256, 8000};
  const ProgramSpec spec{{}, 4, 1, false};
  const MemoryPlan p = yuan::plan_memory(Device::Cuda, c, spec, params(c));
  const size_t before = yuan::cuda_free_bytes();
  yuan::test::Model m = yuan::test::make_model(Device::Cuda, c, spec, nullptr);
  const size_t used = before - yuan::cuda_free_bytes();
  EXPECT_GE(used, p.total()) << p.describe();
  EXPECT_LE(used, p.total() + (size_t(64) << 20)) << p.describe();
}

}  // namespace
