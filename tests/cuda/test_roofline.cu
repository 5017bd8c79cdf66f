// The memory-bound ops held to their ideal bytes, on the emulator: one training micro-batch of the GPT program and
// one GPU AdamW step, under the kernel account, at the widths and heads of gpt-small and of Yuan-4.7B, cut to what
// the emulator runs in seconds: one layer, 64 positions, a vocabulary of 8011 ids (odd, so that the logits' rows
// carry padding, as GPT-2's 50257 do). No op's bytes per element depend on the cut dimensions. For each op whose FLOPs per ideal
// byte put it below an H100's ridge point (memory-bound there), the bytes its kernels touched must be within 1.15
// times its ideal (src/ops/op_cost.h), and its global requests' sectors at least 90% used, unless the op states
// why not (its `exempt`). The emulator's traffic model is docs/EMULATOR.md's "Traffic"; on a GPU the account has
// times instead, which belong to benchmarks, so there this test has nothing to check.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_adamw.h"
#include "gpu_test.h"
#include "kernel_account.cuh"

namespace {

using namespace yuan;
using namespace yuan::test;
namespace gpu = yuan::gpu;

constexpr double kMaxTouched = 1.15;        // touched bytes over the op's ideal
constexpr double kMinSectorEfficiency = 0.9;  // bytes used over bytes in the sectors fetched
// An H100 SXM's dense bf16 peak over its HBM bandwidth (input/machines/h100-sxm.ini): FLOPs per byte below this
// make an op memory-bound there.
constexpr double kRidge = 989e12 / 3.35e12;
constexpr size_t kAdamWParams = 1 << 20;  // the optimizer's op, over a slice of the parameters

struct Deck {
  const char* name;
  int n_head, n_embd, vocab, B;
};
// The widths and heads of input/gpt-small.ini and input/yuan-4.7b.ini.
const Deck kDecks[] = {{"gpt-small", 12, 768, 8011, 2}, {"yuan-4.7b", 24, 3072, 8011, 1}};

// Uniform in [-0.035, 0.035), about GPT-2's N(0, 0.02) in spread: the values only have to keep the activations
// finite, and a hundred million of them come quicker from a Weyl sequence than from a normal distribution.
std::vector<float> small_weights(size_t n) {
  std::vector<float> v(n);
  uint32_t x = 7;
  for (float& w : v) w = 0.07f * (static_cast<float>(x += 0x9e3779b9u) * 0x1p-32f - 0.5f);
  return v;
}

#ifdef YUAN_EMU
// The host calls that waited for the device or allocated between two readings of emu::host_calls(), in words.
std::vector<std::string> host_calls_between(const std::vector<emu::HostCall>& before,
                                            const std::vector<emu::HostCall>& after) {
  std::vector<std::string> out;
  for (const emu::HostCall& a : after) {
    uint64_t n = a.count;
    for (const emu::HostCall& b : before)
      if (b.call == a.call && b.caller == a.caller) n -= b.count;
    if (n) out.push_back(std::to_string(n) + " x " + a.call + " from " + a.caller);
  }
  return out;
}
#endif

class Roofline : public ::testing::TestWithParam<Deck> {};

TEST_P(Roofline, MemoryBoundOpsMoveTheirIdealBytes) {
  YUAN_REQUIRE_GPU();
#ifndef YUAN_EMU
  GTEST_SKIP() << "the traffic is counted by the emulator; on a GPU the account's times are benchmarks' business";
#else
  const Deck d = GetParam();
  GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_head = d.n_head;
  cfg.n_embd = d.n_embd;
  cfg.seq_len = 64;
  cfg.vocab_size = d.vocab;
  // The weights go in as bf16 bits by one copy: through set_params the cast kernel would run under the emulator's
  // checks for every parameter, most of the test's time at Yuan's width.
  const std::vector<float> weights = small_weights(ParamLayout(cfg).total());
  Model m = make_model(Device::Cuda, cfg, {{}, d.B, 1, false}, nullptr);
  ASSERT_EQ(m.backend->weights().dtype, DType::BF16);
  const std::vector<uint16_t> bits = to_bf16(weights);
  CUDA_CHECK(cudaMemcpy(m.backend->weights().data, bits.data(), bits.size() * sizeof(uint16_t),
                        cudaMemcpyHostToDevice));
  std::mt19937 gen(11);
  std::vector<int32_t> tokens(static_cast<size_t>(d.B) * (cfg.seq_len + 1));
  for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % cfg.vocab_size);
  const std::vector<DecaySegment> segments = {{0, kAdamWParams, true}};
  CudaAdamW adamw(*m.backend, 0, kAdamWParams, weights.data(), segments);
  ops::AdamWHyper h;
  h.lr = 1e-4, h.t = 1, h.grad_scale = 1.0;

  std::unique_ptr<KernelAccount> account = m.backend->kernel_account();
  ASSERT_TRUE(account);
  m.program->forward_loss(tokens.data(), d.B);  // the first micro-batch's allocations: token staging, GEMM plans
  account->begin_step();
  m.backend->range_push("forward");  // the program's backward runs inside, as the trainer's micro-batches do
  const std::vector<emu::HostCall> before = emu::host_calls();
  m.program->forward_backward(tokens.data(), d.B, 1.0f, nullptr);
  const std::vector<std::string> waits = host_calls_between(before, emu::host_calls());
  m.backend->range_pop();
  // A micro-batch allocates nothing, and waits for the device only where it says so: to read its loss (the copy
  // into pageable memory, and the wait for it), and for the token staging buffer to be free of the previous
  // micro-batch's copy (long finished but for the first).
  const std::vector<std::string> stated = {
      "1 x cudaEventSynchronize from yuan::gpu::(anonymous namespace)::CudaOps::load_tokens",
      "1 x cudaMemcpy2DAsync from yuan::gpu::copy_2d_async",
      "1 x cudaStreamSynchronize from yuan::gpu::(anonymous namespace)::CudaOps::to_host_f32"};
  EXPECT_EQ(waits, stated);
  m.backend->range_push("optimizer");
  adamw.grad_sum_squares();
  adamw.step(h);
  m.backend->range_pop();
  account->end_step();
  const KernelReport r = account->report();

  std::printf("%s, 1 layer, T %d, B %d: the ops below an H100's ridge (%.0f FLOP/B)\n", d.name, cfg.seq_len, d.B,
              kRidge);
  std::printf("%-22s %-9s %-26s %12s %8s %7s %9s %s\n", "op", "phase", "shape", "ideal B", "touched", "sectors",
              "conflicts", "exempt");
  int checked = 0;
  for (const AccountedOp& op : r.ops) {
    if (op.roof != Roof::Device || op.ideal_bytes <= 0 || op.flops / op.ideal_bytes >= kRidge) continue;
    // A GEMM's bytes are cuBLASLt's, which the emulator does not count (a matmul is compute-bound at a training
    // micro-batch's rows anyway; here, at 64, its FLOPs per byte fall below the ridge).
    bool library = false;
    for (const KernelTime& k : op.kernels) library |= k.name.rfind("cublasLt", 0) == 0;
    const KernelTime t = op_traffic(op);
    if (library || t.requests == 0) continue;  // t.requests == 0: a copy or memset of the runtime
    const double touched_bytes = double(t.read_bytes + t.written_bytes);
    const double touched = touched_bytes / op.ideal_bytes, efficiency = sector_efficiency(t);
    std::printf("%-22s %-9s %-26s %12.0f %8.3f %7.3f %9.2f %s\n", op.name.c_str(), op.phase.c_str(), op.shape.c_str(),
                op.ideal_bytes, touched, efficiency,
                t.shared_requests ? double(t.bank_conflicts) / double(t.shared_requests) : 0.0, op.exempt.c_str());
    for (const std::string& f : t.findings) std::printf("    %s\n", f.c_str());
    checked++;
    if (!op.exempt.empty()) continue;
    EXPECT_LE(touched, kMaxTouched) << op.name << " (" << op.phase << ", " << op.shape << ") touches "
                                    << touched_bytes << " bytes of an ideal " << op.ideal_bytes;
    EXPECT_GE(efficiency, kMinSectorEfficiency) << op.name << " (" << op.phase << ", " << op.shape << ")";
  }
  // The program's memory-bound families, and the optimizer's: none may drop out of the account unnoticed.
  for (const char* family : {"encoder", "layernorm", "classifier", "adamw"}) {
    bool seen = false;
    for (const AccountedOp& op : r.ops) seen |= op.family == family;
    EXPECT_TRUE(seen) << "no " << family << " op in the account";
  }
  EXPECT_GE(checked, 6);
#endif
}

INSTANTIATE_TEST_SUITE_P(Decks, Roofline, ::testing::ValuesIn(kDecks),
                         [](const ::testing::TestParamInfo<Deck>& p) {
                           std::string n = p.param.name;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

}  // namespace
