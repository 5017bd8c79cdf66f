// The GPT program on the CUDA backend against the float64 PyTorch truth in tests/data/gpt_tiny_ref.safetensors (made by
// tools/make_reference.py, which documents its contents): logits, loss and every gradient at the initial
// parameters, then three training steps with the GPU AdamW (clipping by the fixture's rule, the fixture's
// learning rates). Tolerances are bf16's, not fp32's 1e-5 of tests/test_reference.cpp: loss and grad norms 1e-2
// relative, logits 3e-2 and gradients 5e-2 of each tensor's scale (bf16 weights and activations, see
// test_backend.cu), final parameters 2e-2: AdamW moves every parameter by up to lr per step whatever the size
// of its gradient, so gradient elements that are ~0 in the truth and bf16 noise here (c_attn's key bias) move
// by up to 3 * lr = 3e-3, about 1e-2 of the smallest tensor scales.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda_adamw.h"
#include "backend/cuda_backend.h"
#include "config/config.h"
#include "gpu_test.h"
#include "model/gpt.h"
#include "optim/zero.h"
#include "util/safetensors.h"

namespace {

using namespace yuan::test;

const char* kFixture = "tests/data/gpt_tiny_ref.safetensors";  // tests run from the repository root

TEST(CudaReference, MatchesPyTorchFloat64) {
  YUAN_REQUIRE_GPU();
  yuan::SafetensorsReader f(kFixture);
  auto i = [&](const char* k) { return std::stoi(f.meta(k)); };
  auto d = [&](const char* k) { return std::stod(f.meta(k)); };
  const yuan::GPTConfig c{i("n_layer"), i("n_head"), i("n_embd"), i("seq_len"), i("vocab_size")};
  const int B = i("batch"), steps = i("steps"), T = c.seq_len, V = c.vocab_size;
  const yuan::ParamLayout L(c);
  auto flat = [&](const std::string& prefix) {
    std::vector<float> out(L.total());
    for (const auto& t : L.tensors()) f.read_f32(prefix + t.name, t.shape, out.data() + t.offset);
    return out;
  };
  const auto params = flat("param."), grads = flat("grad."), final_params = flat("final.");
  const auto tokens = f.read_i32("tokens", {steps, B, T + 1});
  const auto logits = f.read_f32("logits", {B, T, V});
  const double loss = f.read_f64("loss", {})[0];
  const auto losses = f.read_f64("losses", {steps}), norms = f.read_f64("grad_norms", {steps}),
             lrs = f.read_f64("lrs", {steps});

  Model model = make_model(yuan::Device::Cuda, c, {{}, B, 1, false}, params.data());
  yuan::Backend& be = *model.backend;
  yuan::Program& program = *model.program;
  const float got_loss = program.forward_backward(tokens.data(), B, 1.0f, nullptr);
  EXPECT_NEAR(got_loss, loss, 1e-2 * loss);
  const std::vector<float> g = grads_of(be);
  for (const auto& t : L.tensors())
    EXPECT_LT(rel_err(g.data() + t.offset, grads.data() + t.offset, t.numel), 5e-2) << "gradient of " << t.name;
  std::vector<float> row(static_cast<size_t>(T) * V);
  for (int b = 0; b < B; b++) {
    program.forward_logits(tokens.data() + static_cast<size_t>(b) * (T + 1), T, row.data());
    EXPECT_LT(rel_err(row.data(), logits.data() + static_cast<size_t>(b) * T * V, row.size()), 3e-2) << "row " << b;
  }

  be.zero_grads(0, L.total());
  yuan::CudaAdamW opt(be, 0, L.total(), params.data(), yuan::decay_segments(L, 0, L.total()));
  yuan::OptimConfig oc;
  oc.beta1 = d("beta1");
  oc.beta2 = d("beta2");
  oc.eps = d("eps");
  oc.weight_decay = d("weight_decay");
  oc.grad_clip = d("grad_clip");
  for (int s = 0; s < steps; s++) {
    const float l = program.forward_backward(tokens.data() + static_cast<size_t>(s) * B * (T + 1), B, 1.0f, nullptr);
    EXPECT_NEAR(l, losses[s], 1e-2 * losses[s]) << "step " << s;
    const double norm = std::sqrt(opt.grad_sum_squares());
    EXPECT_NEAR(norm, norms[s], 1e-2 * norms[s]) << "step " << s;
    opt.step(yuan::adamw_hyper(oc, lrs[s], s + 1, norm));
    be.zero_grads(0, L.total());
  }
  std::vector<float> got(L.total());
  opt.master_to_host(got.data());
  for (const auto& t : L.tensors())
    EXPECT_LT(rel_err(got.data() + t.offset, final_params.data() + t.offset, t.numel), 2e-2) << "final " << t.name;
}

}  // namespace
