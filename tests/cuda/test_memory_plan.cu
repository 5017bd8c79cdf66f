// The CUDA memory plan is arithmetic, so these run without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda_backend.h"
#include "util/error.h"

namespace {

using yuan::CudaMemoryPlan;
using yuan::GPTConfig;

const GPTConfig kSmall{12, 12, 768, 1024, 50257};
const GPTConfig kXl{24, 16, 2048, 2048, 50257};

TEST(CudaMemoryPlan, WeightsAndGradsAreBf16AndFp32OfEveryParameter) {
  for (GPTConfig c : {kSmall, kXl, GPTConfig{2, 4, 32, 12, 97}}) {
    const size_t n = yuan::ParamLayout(c).total();
    CudaMemoryPlan p = yuan::plan_cuda_memory(c, 4, false);
    EXPECT_EQ(p.weights, 2 * n);
    EXPECT_EQ(p.grads, 4 * n);
    EXPECT_EQ(p.total(), p.weights + p.grads + p.activations + p.buffers);
  }
}

TEST(CudaMemoryPlan, ActivationsMatchTheKeptTensors) {
  // Per token and layer: 16 C bf16 values (ln1, qkv 3C, atty, res2, ln2, fch 4C, fch_gelu 4C, res3) and
  // 4 + NH fp32 (LayerNorm means and rstds, attention lse); then encoded, lnf, their stats, the losses and the
  // bf16 logits with rows padded to 50304. The carver rounds each buffer up to 256 bytes.
  const GPTConfig c = kSmall;
  const size_t B = 8, BT = B * c.seq_len, C = c.n_embd, L = c.n_layer, Vp = 50304;
  const size_t per_layer = BT * C * 2 * (1 + 3 + 1 + 1 + 1 + 4 + 4) + BT * 4 * (4 + c.n_head);
  const size_t rest = L * BT * C * 2 /*res3*/ + 2 * BT * C * 2 /*encoded, lnf*/ + 3 * BT * 4 + BT * Vp * 2;
  const size_t expect = L * per_layer + rest;
  const CudaMemoryPlan p = yuan::plan_cuda_memory(c, static_cast<int>(B), false);
  EXPECT_GE(p.activations, expect);
  EXPECT_LT(p.activations, expect + 256 * (L * 12 + L + 6));
  // GPT-2 small at B=8, T=1024: 2.27 GiB of blocks + 0.77 GiB of logits.
  EXPECT_NEAR(p.activations / 1073741824.0, 3.05, 0.01);
}

TEST(CudaMemoryPlan, RecomputeKeepsOneLayerOfActivations) {
  const CudaMemoryPlan full = yuan::plan_cuda_memory(kXl, 4, false), re = yuan::plan_cuda_memory(kXl, 4, true);
  EXPECT_EQ(full.weights, re.weights);
  EXPECT_EQ(full.grads, re.grads);
  EXPECT_EQ(full.buffers, re.buffers);
  EXPECT_LT(re.activations * 5, full.activations) << "recompute should keep ~1/16 of the per-layer activations";
}

TEST(CudaMemoryPlan, ActivationsAndBuffersGrowWithTheMicroBatch) {
  const CudaMemoryPlan one = yuan::plan_cuda_memory(kSmall, 1, false), two = yuan::plan_cuda_memory(kSmall, 2, false);
  EXPECT_EQ(one.weights, two.weights);
  EXPECT_NEAR(static_cast<double>(two.activations) / one.activations, 2.0, 0.01);
  EXPECT_GT(two.buffers, one.buffers);
}

TEST(CudaMemoryPlan, CheckFitsOrSaysWhatToTry) {
  const CudaMemoryPlan p = yuan::plan_cuda_memory(kSmall, 16, false);
  EXPECT_NO_THROW(yuan::check_cuda_memory(kSmall, 16, false, p.total()));
  const size_t fits_8 = yuan::plan_cuda_memory(kSmall, 8, false).total();
  try {
    yuan::check_cuda_memory(kSmall, 16, false, fits_8);
    FAIL() << "no error for a plan of " << p.total() << " bytes in " << fits_8;
  } catch (const yuan::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("memory plan: needs "), 0u) << msg;
    EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("try train.micro_batch=8 or train.recompute=true"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
  try {
    yuan::check_cuda_memory(kSmall, 1, false, 1 << 20);
    FAIL() << "no error for 1 MiB";
  } catch (const yuan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute=true"), std::string::npos) << e.what();
  }
}

}  // namespace
