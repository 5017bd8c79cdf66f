// The one GPT program (program/program.h) on the CPU backend: a model cut into pipeline stages, a recomputed model
// and a model with several micro-batches in flight compute what the whole model computes. The whole model itself
// is checked against PyTorch in test_reference.cpp; here every variant is compared with it, bit for bit where
// the arithmetic is the same, and the parameter-table subsets the stages hold.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"
#include "program/params.h"
#include "program/program.h"
#include "test_util.h"
#include "util/rng.h"

namespace yuan {
namespace {

const GPTConfig kCfg{3, 2, 16, 7, 23};  // modules: wte, wpe, h.0, h.1, h.2, ln_f
constexpr int kB = 3;

// Weights with more spread than GPT-2's initialisation, so that no gradient is flat.
std::vector<float> test_params(const ParamLayout& L) {
  std::vector<float> p(L.total());
  init_gpt2(L, 11, p.data());
  Rng rng(5, 0);
  for (float& x : p) x += 0.3f * (rng.next_uniform() - 0.5f);
  return p;
}

std::vector<int32_t> test_tokens(int rows, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(rows) * (kCfg.seq_len + 1));
  Rng rng(seed, 1);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_u64() % kCfg.vocab_size);
  return t;
}

// A backend holding `modules`, with the whole model's weights of those modules, and their layout.
struct Held {
  ParamLayout layout;
  std::unique_ptr<Backend> be;
};
Held backend_for(const std::vector<int>& modules, const std::vector<float>& whole) {
  Held h{ParamLayout(kCfg, modules), nullptr};
  h.be = make_backend(Device::Cpu, backend_spec(h.layout));
  const ParamLayout full(kCfg);
  for (const ModuleSpec& m : h.layout.modules())
    h.be->set_params(whole.data() + full.module(m.index).offset, m.offset, m.numel);
  return h;
}

std::vector<float> grads_of(Backend& be) {
  std::vector<float> g(be.size());
  be.grads_to_host(0, g.size(), g.data());
  return g;
}

struct WholeRun {
  float loss = 0;
  std::vector<float> grads;
  std::vector<int> ready;
};

// `micro` micro-batches of kB rows, each forward then backward, on the whole model.
WholeRun run_whole(const std::vector<std::vector<int32_t>>& batches, bool recompute = false) {
  const std::vector<float> w = test_params(ParamLayout(kCfg));
  Held h = backend_for(held_modules(kCfg, all_modules(kCfg)), w);
  Program p(*h.be, h.layout, {{}, kB, 1, recompute});
  WholeRun r;
  for (const auto& tok : batches)
    r.loss += p.forward_backward(tok.data(), kB, 1.0f / batches.size(), [&](int m) { r.ready.push_back(m); });
  r.grads = grads_of(*h.be);
  return r;
}

TEST(ParamLayoutSubset, StagesHoldTheirModulesWithTheWholeModelsNamesAndValues) {
  const ParamLayout full(kCfg);
  const int n = module_count(kCfg);
  EXPECT_EQ(held_modules(kCfg, {0, 3}), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(held_modules(kCfg, {3, n}), (std::vector<int>{0, 3, 4, 5})) << "the last stage holds the tied wte";
  EXPECT_EQ(held_modules(kCfg, {0, n}).size(), static_cast<size_t>(n));
  const ParamLayout last(kCfg, held_modules(kCfg, {3, n}));
  EXPECT_EQ(last.modules().size(), 4u);
  size_t next = 0;
  for (const ModuleSpec& m : last.modules()) {
    EXPECT_EQ(m.offset, next) << m.name;
    EXPECT_EQ(m.name, full.module(m.index).name);
    EXPECT_EQ(m.numel, full.module(m.index).numel);
    next += m.numel;
  }
  EXPECT_EQ(next, last.total());
  EXPECT_FALSE(last.has(kWpeModule));
  EXPECT_TRUE(last.has(ln_f_module(kCfg)));
  EXPECT_EQ(last.block(1, kFcW).name, "h.1.mlp.c_fc.weight");
  EXPECT_EQ(last.block(1, kFcW).id, full.block(1, kFcW).id);
  const std::string err = testing::error_of([&] { last.wpe(); });
  EXPECT_NE(err.find("wpe"), std::string::npos) << err;
  EXPECT_NE(testing::error_of([&] { ParamLayout(kCfg, {2, 1}); }), "") << "modules out of order";
  EXPECT_NE(testing::error_of([&] { ParamLayout(kCfg, {0, n}); }), "") << "a module past the model";

  // A stage initialises its modules to exactly the whole model's values.
  std::vector<float> whole(full.total()), part(last.total());
  init_gpt2(full, 3, whole.data());
  init_gpt2(last, 3, part.data());
  for (const ModuleSpec& m : last.modules())
    EXPECT_EQ(0, std::memcmp(part.data() + m.offset, whole.data() + full.module(m.index).offset, m.numel * 4))
        << m.name;
}

// Stages [0, k) and [k, n) (and a three-way cut) pass the activation forward and its gradient back by copying
// host memory; the result is the whole model's, except for wte's gradient, whose two halves (the embedding's on
// the first stage, the tied classifier's on the last) are summed in another order.
TEST(ProgramStages, ACutModelComputesTheWholeModel) {
  const std::vector<std::vector<int32_t>> batches = {test_tokens(kB, 1)};
  const WholeRun whole = run_whole(batches);
  const ParamLayout full(kCfg);
  const std::vector<float> w = test_params(full);
  const int n = module_count(kCfg);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 3, n}, std::vector<int>{0, 2, n}, std::vector<int>{0, 4, 5, n},
                                       std::vector<int>{0, 5, n}}) {
    SCOPED_TRACE(::testing::Message() << "cut at modules " << cuts[1]);
    std::vector<Held> be;
    std::vector<std::unique_ptr<Program>> st;
    for (size_t s = 0; s + 1 < cuts.size(); s++) {
      const ModuleRange r{cuts[s], cuts[s + 1]};
      be.push_back(backend_for(held_modules(kCfg, r), w));
      st.push_back(std::make_unique<Program>(*be.back().be, be.back().layout, ProgramSpec{r, kB, 1, false}));
    }
    const int32_t* tok = batches[0].data();
    std::vector<int> ready;
    auto hook = [&](int m) { ready.push_back(m); };
    for (size_t s = 0; s < st.size(); s++) {
      if (s > 0) {
        const Tensor from = st[s - 1]->output(0), to = st[s]->input_buffer(0, kB);
        std::memcpy(to.data, from.data, from.numel() * sizeof(float));
      }
      st[s]->forward(0, st[s]->embeds() || st[s]->runs_head() ? tok : nullptr, kB);
    }
    const float loss = st.back()->loss(0, 1.0f);
    EXPECT_EQ(loss, whole.loss);
    for (size_t s = st.size(); s-- > 0;) st[s]->backward(0, s + 1 < st.size() ? st[s + 1]->input_grad(0) : Tensor(), hook);
    // In backward order, with wte reported twice: the last stage's tied copy, then the first stage's embedding.
    std::vector<int> want = whole.ready;
    want.insert(want.begin() + 1, kWteModule);
    EXPECT_EQ(ready, want);
    std::vector<float> sum(full.total(), 0.0f);
    for (Held& b : be) {
      const std::vector<float> g = grads_of(*b.be);
      for (const ModuleSpec& m : b.layout.modules())
        for (size_t i = 0; i < m.numel; i++) sum[full.module(m.index).offset + i] += g[m.offset + i];
    }
    for (const TensorSpec& t : full.tensors()) {
      const double err = testing::rel_err(sum.data() + t.offset, whole.grads.data() + t.offset, t.numel);
      if (t.module == kWteModule)
        EXPECT_LT(err, 1e-6) << t.name;
      else
        EXPECT_EQ(err, 0.0) << t.name;
    }
  }
}

TEST(ProgramRecompute, GivesTheSameBits) {
  const std::vector<std::vector<int32_t>> batches = {test_tokens(kB, 2), test_tokens(kB, 3)};
  const WholeRun kept = run_whole(batches), recomputed = run_whole(batches, true);
  EXPECT_EQ(kept.loss, recomputed.loss);
  EXPECT_EQ(kept.grads, recomputed.grads);
}

// GPipe order on one stage: every forward (and loss), then every backward, each micro-batch in its own slot.
TEST(ProgramSlots, MicroBatchesInFlightGiveTheSequentialResult) {
  const std::vector<std::vector<int32_t>> batches = {test_tokens(kB, 4), test_tokens(kB, 5), test_tokens(kB, 6)};
  const WholeRun seq = run_whole(batches);
  for (bool recompute : {false, true}) {
    Held h = backend_for(held_modules(kCfg, all_modules(kCfg)), test_params(ParamLayout(kCfg)));
    Program p(*h.be, h.layout, {{}, kB, 3, recompute});
    float loss = 0;
    for (int m = 0; m < 3; m++) {
      p.forward(m, batches[m].data(), kB);
      loss += p.loss(m, 1.0f / 3);
    }
    for (int m = 0; m < 3; m++) p.backward(m, {}, nullptr);
    EXPECT_EQ(loss, seq.loss) << "recompute " << recompute;
    // Every parameter gradient adds the micro-batches in the same order, except wte's, whose classifier parts
    // now all come before its embedding parts.
    const std::vector<float> g = grads_of(*h.be);
    for (const TensorSpec& t : h.layout.tensors()) {
      const double err = testing::rel_err(g.data() + t.offset, seq.grads.data() + t.offset, t.numel);
      if (t.module == kWteModule)
        EXPECT_LT(err, 1e-6) << t.name << ", recompute " << recompute;
      else
        EXPECT_EQ(err, 0.0) << t.name << ", recompute " << recompute;
    }
  }
}

TEST(ProgramMemory, PlanMatchesWhatTheProgramAllocates) {
  for (const ProgramSpec& spec : {ProgramSpec{{}, kB, 1, false}, ProgramSpec{{0, 3}, 2, 2, false},
                                  ProgramSpec{{3, module_count(kCfg)}, kB, 3, true}}) {
    const ProgramMemory plan = Program::plan(kCfg, tensor_formats(Device::Cpu), spec);
    const ParamLayout L(kCfg, held_modules(kCfg, spec.modules.size() ? spec.modules : all_modules(kCfg)));
    auto be = make_backend(Device::Cpu, backend_spec(L));
    const size_t acts = mem_bytes(Mem::Activations), bufs = mem_bytes(Mem::Comm);
    Program p(*be, L, spec);
    EXPECT_EQ(mem_bytes(Mem::Activations) - acts, plan.activations);
    EXPECT_EQ(mem_bytes(Mem::Comm) - bufs, plan.buffers);
  }
  // Recompute keeps one block's activations instead of every block's.
  const ProgramMemory full = Program::plan(kCfg, tensor_formats(Device::Cpu), {{}, kB, 1, false});
  const ProgramMemory re = Program::plan(kCfg, tensor_formats(Device::Cpu), {{}, kB, 1, true});
  EXPECT_LT(re.activations, full.activations);
  EXPECT_EQ(re.buffers, full.buffers);
}

TEST(ProgramErrors, RangesAndCallsThatCannotWork) {
  const ParamLayout L(kCfg, held_modules(kCfg, {0, 3}));
  auto be = make_backend(Device::Cpu, backend_spec(L));
  EXPECT_NE(testing::error_of([&] { Program(*be, L, {{1, 3}, kB, 1, false}); }).find("split wte from wpe"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { Program(*be, L, {{0, 4}, kB, 1, false}); }).find("not in the backend's layout"),
            std::string::npos);
  // The backend's buffers must be the layout's: not another layout's, nor ZeRO-3's shards without their source.
  const ParamLayout other(kCfg, held_modules(kCfg, {0, 4}));
  EXPECT_NE(testing::error_of([&] { Program(*be, other, {{0, 4}, kB, 1, false}); }).find("do not hold the layout's"),
            std::string::npos);
  auto shards = make_backend(Device::Cpu, backend_spec(L, L.total() / 2));
  EXPECT_NE(testing::error_of([&] { Program(*shards, L, {{0, 3}, kB, 1, false}); }).find("ZeRO-3 shards"),
            std::string::npos);
  Program p(*be, L, {{0, 3}, kB, 1, false});
  const std::vector<int32_t> tok = test_tokens(kB, 7);
  p.forward(0, tok.data(), kB);
  EXPECT_NE(testing::error_of([&] { p.loss(0, 1.0f); }).find("without the head"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { p.forward(1, tok.data(), kB); }).find("slot 1"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { p.forward(0, tok.data(), kB + 1); }).find("micro-batch"), std::string::npos);
  std::vector<int32_t> bad = tok;
  bad[5] = kCfg.vocab_size;
  EXPECT_NE(testing::error_of([&] { p.forward(0, bad.data(), kB); }).find("outside the vocabulary"),
            std::string::npos);
}

// What a backend's ops ask of a model's shape is stated in its TensorFormats and checked where a model meets the
// backend (a Program, a rank's plan), whatever the backend was made for: it is made from sizes only.
TEST(ProgramErrors, ShapesTheBackendsOpsCannotRun) {
  EXPECT_EQ(testing::error_of([] { check_op_constraints(GPTConfig{2, 1, 5, 4, 9}, Device::Cpu, AttentionPath::Own); }), "")
      << "the CPU reference ops take any width and head size";
#ifdef YUAN_CUDA
  EXPECT_EQ(testing::error_of([] { check_op_constraints(GPTConfig{1, 4, 100, 8, 8}, Device::Cuda, AttentionPath::Own); }),
            "cuda backend: n_embd = 100 must be a multiple of 8 (16-byte bf16 vectors)");
  for (const GPTConfig& c : {GPTConfig{1, 4, 48, 8, 8}, GPTConfig{1, 1, 256, 8, 8}, GPTConfig{1, 3, 64, 8, 8}})
    EXPECT_EQ(testing::error_of([&] { check_op_constraints(c, Device::Cuda, AttentionPath::Own); }),
              strf("cuda backend: head size n_embd/n_head = %d/%d must be a multiple of 8 and at most 128", c.n_embd,
                   c.n_head));
  EXPECT_EQ(testing::error_of([] { check_op_constraints(GPTConfig{1, 2, 256, 8, 8}, Device::Cuda, AttentionPath::Own); }),
            "");
  EXPECT_EQ(testing::error_of([] {
              check_op_constraints(GPTConfig{1, 1, 256, 8, 8}, Device::Cuda, AttentionPath::Cudnn);
            }),
            "")
      << "cuDNN takes heads of 256";
#endif
}

// model.attention: what each request gets, and the refusals, on the CPU and (built in, no device visible here:
// the build and the shape decide) on CUDA.
TEST(ProgramErrors, AttentionChoice) {
  EXPECT_EQ(choose_attention(Device::Cpu, std::nullopt, 64, 64).path, AttentionPath::Own);
  EXPECT_EQ(choose_attention(Device::Cpu, AttentionPath::Own, 64, 64).path, AttentionPath::Own);
  EXPECT_EQ(testing::error_of([] { choose_attention(Device::Cpu, AttentionPath::Cudnn, 64, 64); }),
            "model.attention = cudnn on train.device=cpu: the cpu backend runs the reference attention");
  // The model's request as the backend takes it: auto leaves the choice to the backend, the others name a path.
  GPTConfig c{1, 1, 64, 64, 8};
  EXPECT_EQ(choose_attention(Device::Cpu, c).path, AttentionPath::Own);
  c.attention = AttentionKernels::Own;
  EXPECT_EQ(choose_attention(Device::Cpu, c).why, "as model.attention asks");
  c.attention = AttentionKernels::Cudnn;
  EXPECT_EQ(testing::error_of([&] { choose_attention(Device::Cpu, c); }),
            "model.attention = cudnn on train.device=cpu: the cpu backend runs the reference attention");
#ifdef YUAN_CUDA
  EXPECT_EQ(choose_attention(Device::Cuda, AttentionPath::Own, 64, 64).path, AttentionPath::Own);
  const AttentionChoice odd = choose_attention(Device::Cuda, std::nullopt, 12, 64);
  EXPECT_EQ(odd.path, AttentionPath::Own);
  EXPECT_NE(odd.why.find("no cuDNN: "), std::string::npos) << odd.why;
  EXPECT_NE(testing::error_of([] { choose_attention(Device::Cuda, AttentionPath::Cudnn, 264, 64); })
                .find("model.attention = cudnn on train.device=cuda: "),
            std::string::npos);
#ifdef YUAN_CUDNN
  EXPECT_EQ(choose_attention(Device::Cuda, std::nullopt, 64, 64).path, AttentionPath::Cudnn);
  EXPECT_EQ(choose_attention(Device::Cuda, AttentionPath::Cudnn, 256, 64).path, AttentionPath::Cudnn);
  EXPECT_EQ(choose_attention(Device::Cuda, std::nullopt, 64, 1).path, AttentionPath::Own) << "one position";
#else
  EXPECT_NE(odd.why.find("this build has no cuDNN"), std::string::npos) << odd.why;
#endif
#endif
}

}  // namespace
}  // namespace yuan
