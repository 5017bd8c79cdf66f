// The C++ model against the float64 PyTorch truth in tests/data/gpt_tiny_ref.safetensors (made by
// tools/make_reference.py, which documents its contents): logits, loss, every gradient, and three training
// steps through the trainer's exact path (CPU backend + ZeroOptimizer + schedule). Also the parameter table,
// the initialisation, and the safetensors reader/writer the fixture is read with.
//
// "Relative error" throughout is max|a - ref| / max|ref| over a whole tensor: single elements can be ~0, so the
// tensor's scale is the yardstick. Tolerances: logits, losses and parameters 1e-5, gradients 1e-4 (float32
// arithmetic lands within ~1e-6 of the truth; make_reference.py prints how close float32 torch gets).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "model/gpt.h"
#include "optim/lr_schedule.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "run/commands.h"
#include "test_util.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/safetensors.h"

namespace {

using yuan::GPTConfig;
using yuan::ParamLayout;
using yuan::SafetensorsReader;
using yuan::SafetensorsWriter;

const char* kFixture = "tests/data/gpt_tiny_ref.safetensors";  // tests run from the repository root

using yuan::testing::rel_err;
double rel_err(double a, double ref) { return std::fabs(a - ref) / std::fabs(ref); }

struct Reference {
  SafetensorsReader file{kFixture};
  GPTConfig cfg;
  int B = 0, steps = 0;
  yuan::OptimConfig optim;
  std::unique_ptr<ParamLayout> layout;
  std::vector<float> params;    // initial, flat in layout order
  std::vector<int32_t> tokens;  // [steps, B, T+1]

  Reference() {
    auto i = [&](const char* k) { return std::stoi(file.meta(k)); };
    auto d = [&](const char* k) { return std::stod(file.meta(k)); };
    cfg.n_layer = i("n_layer");
    cfg.n_head = i("n_head");
    cfg.n_embd = i("n_embd");
    cfg.seq_len = i("seq_len");
    cfg.vocab_size = i("vocab_size");
    B = i("batch");
    steps = i("steps");
    optim.lr = d("lr");
    optim.warmup_steps = i("warmup_steps");
    optim.min_lr = d("min_lr");
    optim.weight_decay = d("weight_decay");
    optim.beta1 = d("beta1");
    optim.beta2 = d("beta2");
    optim.eps = d("eps");
    optim.grad_clip = d("grad_clip");
    layout = std::make_unique<ParamLayout>(cfg);
    params = flat("param.");
    tokens = file.read_i32("tokens", {steps, B, cfg.seq_len + 1});
  }
  // The tensors prefix+<name> of the fixture as one flat buffer in layout order.
  std::vector<float> flat(const std::string& prefix) const {
    std::vector<float> out(layout->total());
    for (const auto& t : layout->tensors()) file.read_f32(prefix + t.name, t.shape, out.data() + t.offset);
    return out;
  }
  const int32_t* batch(int step) const { return tokens.data() + static_cast<size_t>(step) * B * (cfg.seq_len + 1); }
  // The CPU backend and the program over every module, for micro-batches of up to B rows; `hook` adds optimizers.
  yuan::Replica model(const yuan::ReplicaHook& hook = {}) const {
    yuan::Replica m;
    yuan::assemble_replica(
        m, {yuan::Device::Cpu, *layout, yuan::backend_spec(*layout), yuan::ProgramSpec{{}, B, 1, false}}, hook);
    return m;
  }
};

// ---- the parameter table and the initialisation ----

TEST(GptLayout, ModulesAreContiguousAndTotalMatchesCount) {
  for (GPTConfig c : {GPTConfig{2, 4, 32, 12, 97}, GPTConfig{3, 2, 8, 5, 11}, GPTConfig{12, 12, 768, 1024, 50257}}) {
    ParamLayout L(c);
    const size_t nl = c.n_layer, C = c.n_embd;
    EXPECT_EQ(L.total(), 12 * nl * C * C + 13 * nl * C + c.vocab_size * C + c.seq_len * C + 2 * C);
    ASSERT_EQ(L.modules().size(), nl + 3);
    EXPECT_EQ(L.modules().front().name, "wte");
    EXPECT_EQ(L.modules()[1].name, "wpe");
    EXPECT_EQ(L.modules().back().name, "ln_f");
    size_t next = 0;
    int next_tensor = 0;
    for (size_t m = 0; m < L.modules().size(); m++) {
      const auto& mod = L.modules()[m];
      if (m >= 2 && m < nl + 2) {
        EXPECT_EQ(mod.name, "h." + std::to_string(m - 2));
      }
      EXPECT_EQ(mod.offset, next) << mod.name;
      EXPECT_EQ(mod.first_tensor, next_tensor) << mod.name;
      size_t inside = mod.offset;
      for (int k = mod.first_tensor; k < mod.first_tensor + mod.n_tensors; k++) {
        const auto& t = L.tensors()[k];
        EXPECT_EQ(t.offset, inside) << t.name;
        EXPECT_EQ(t.module, static_cast<int>(m)) << t.name;
        EXPECT_EQ(t.decay, t.shape.size() >= 2) << t.name;
        size_t n = 1;
        for (int64_t d : t.shape) n *= static_cast<size_t>(d);
        EXPECT_EQ(t.numel, n) << t.name;
        EXPECT_EQ(&L.find(t.name), &t);
        inside += t.numel;
      }
      EXPECT_EQ(inside - mod.offset, mod.numel) << mod.name;
      next += mod.numel;
      next_tensor += mod.n_tensors;
    }
    EXPECT_EQ(next, L.total());
    EXPECT_EQ(static_cast<size_t>(next_tensor), L.tensors().size());
  }
  EXPECT_EQ(ParamLayout(GPTConfig{12, 12, 768, 1024, 50257}).total(), 124439808u);  // HF's count for "gpt2"
  EXPECT_THROW(ParamLayout(GPTConfig{1, 1, 4, 4, 4}).find("h.1.ln_1.weight"), yuan::Error);
}

TEST(GptInit, DeterministicPerSeedWithTheStatedStds) {
  const GPTConfig c{4, 4, 64, 64, 1000};
  ParamLayout L(c);
  std::vector<float> a(L.total()), b(L.total()), other(L.total());
  yuan::init_gpt2(L, 7, a.data());
  yuan::init_gpt2(L, 7, b.data());
  yuan::init_gpt2(L, 8, other.data());
  EXPECT_EQ(a, b) << "same seed, different parameters";
  size_t same = 0, random = 0;
  for (const auto& t : L.tensors()) {
    const float* p = a.data() + t.offset;
    if (t.shape.size() == 1) {
      // 1-d tensors: LayerNorm gains (".weight") and biases
      const bool gain = t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      for (size_t i = 0; i < t.numel; i++) ASSERT_EQ(p[i], gain ? 1.0f : 0.0f) << t.name << "[" << i << "]";
      continue;
    }
    const bool residual = t.name.find("c_proj.weight") != std::string::npos;
    const double want = residual ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
    double sum = 0, sq = 0;
    for (size_t i = 0; i < t.numel; i++) sum += p[i], sq += static_cast<double>(p[i]) * p[i];
    const double n = static_cast<double>(t.numel), mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    // 6 standard errors: the mean's is std/sqrt(n), the sample std's is about std/sqrt(2n).
    EXPECT_NEAR(mean, 0.0, 6 * want / std::sqrt(n)) << t.name;
    EXPECT_NEAR(std, want, 6 * want / std::sqrt(2 * n)) << t.name;
    for (size_t i = 0; i < t.numel; i++) same += p[i] == other[t.offset + i];
    random += t.numel;
  }
  EXPECT_LT(same, random / 1000) << "seeds 7 and 8 give largely the same parameters";
  // A range (a ZeRO shard: pieces of tensors) gets the whole model's values there, and nothing past it is written.
  for (auto [lo, n] : {std::pair<size_t, size_t>{0, 5}, {L.tensors()[3].offset - 7, 4100}, {L.total() - 3, 100}}) {
    std::vector<float> part(n + 1, -9.0f);
    yuan::init_gpt2(L, 7, part.data(), lo, n);
    const size_t got = std::min(n, L.total() - lo);
    for (size_t i = 0; i < got; i++) ASSERT_EQ(part[i], a[lo + i]) << "range from " << lo << ", element " << i;
    for (size_t i = got; i <= n; i++) ASSERT_EQ(part[i], -9.0f) << "written past the range from " << lo;
  }
}

// ---- against the PyTorch truth ----

TEST(Reference, LogitsAndLossAtInitialParams) {
  Reference ref;
  const int T = ref.cfg.seq_len, V = ref.cfg.vocab_size;
  yuan::Replica model = ref.model();
  yuan::Backend* be = model.backend.get();
  be->set_params(ref.params.data(), 0, ref.params.size());
  const std::vector<float> want = ref.file.read_f32("logits", {ref.B, T, V});
  std::vector<float> got(want.size());
  for (int b = 0; b < ref.B; b++)
    model.program->forward_logits(ref.batch(0) + static_cast<size_t>(b) * (T + 1), T, got.data() + static_cast<size_t>(b) * T * V);
  EXPECT_LE(rel_err(got.data(), want.data(), want.size()), 1e-5);
  // A prefix sees only itself (causality): the logits of its positions are those of the full row.
  std::vector<float> prefix(5 * V);
  model.program->forward_logits(ref.batch(0), 5, prefix.data());
  EXPECT_LE(rel_err(prefix.data(), want.data(), prefix.size()), 1e-5);

  const double loss = ref.file.read_f64("loss", {})[0];
  EXPECT_LE(rel_err(model.program->forward_loss(ref.batch(0), ref.B), loss), 1e-5);
  // Single rows (a micro-batch below the backend's maximum): cross-entropy of the reference logits.
  for (int b = 0; b < ref.B; b++) {
    const int32_t* row = ref.batch(0) + static_cast<size_t>(b) * (T + 1);
    double sum = 0;
    for (int t = 0; t < T; t++) {
      const float* l = want.data() + (static_cast<size_t>(b) * T + t) * V;
      double mx = *std::max_element(l, l + V), z = 0;
      for (int v = 0; v < V; v++) z += std::exp(l[v] - mx);
      sum += mx + std::log(z) - l[row[t + 1]];
    }
    EXPECT_LE(rel_err(model.program->forward_loss(row, 1), sum / T), 1e-5) << "row " << b;
  }
  EXPECT_LE(rel_err(model.program->forward_backward(ref.batch(0), ref.B, 1.0f, [](int) {}), loss), 1e-5);
}

TEST(Reference, GradientsAtInitialParams) {
  Reference ref;
  yuan::Replica model = ref.model();
  yuan::Backend* be = model.backend.get();
  be->set_params(ref.params.data(), 0, ref.params.size());
  be->zero_grads(0, be->size());
  std::vector<int> ready;
  model.program->forward_backward(ref.batch(0), ref.B, 1.0f, [&](int m) { ready.push_back(m); });
  // Every module reported once, in reverse layout order (ZeRO-2 reduces buckets as they complete).
  std::vector<int> want_ready;
  for (int m = static_cast<int>(ref.layout->modules().size()) - 1; m >= 0; m--) want_ready.push_back(m);
  EXPECT_EQ(ready, want_ready);

  std::vector<float> grads(be->size());
  be->grads_to_host(0, grads.size(), grads.data());
  const std::vector<float> want = ref.flat("grad.");
  for (const auto& t : ref.layout->tensors())
    EXPECT_LE(rel_err(grads.data() + t.offset, want.data() + t.offset, t.numel), 1e-4) << "gradient of " << t.name;

  // Gradient accumulation as the trainer does it: micro-batches of 1 and 2 rows, each weighted by its share of
  // the tokens, add up to the full batch's mean-loss gradient.
  ASSERT_EQ(ref.B, 3);
  be->zero_grads(0, be->size());
  model.program->forward_backward(ref.batch(0), 1, 1.0f / 3, [](int) {});
  model.program->forward_backward(ref.batch(0) + (ref.cfg.seq_len + 1), 2, 2.0f / 3, [](int) {});
  be->grads_to_host(0, grads.size(), grads.data());
  for (const auto& t : ref.layout->tensors())
    EXPECT_LE(rel_err(grads.data() + t.offset, want.data() + t.offset, t.numel), 1e-4)
        << "accumulated gradient of " << t.name;
}

// The trainer's step, for each ZeRO stage (on one rank they must agree with plain AdamW).
TEST(Reference, ThreeTrainingStepsMatchTorchAdamW) {
  Reference ref;
  const std::vector<double> losses = ref.file.read_f64("losses", {ref.steps});
  const std::vector<double> norms = ref.file.read_f64("grad_norms", {ref.steps});
  const std::vector<double> lrs = ref.file.read_f64("lrs", {ref.steps});
  const std::vector<float> final_params = ref.flat("final.");
  auto comm = yuan::make_local_communicator();
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("optim.zero=" + std::to_string(stage));
    yuan::OptimConfig oc = ref.optim;
    oc.zero = yuan::ZeroStage(stage);
    oc.bucket_mb = 0.02;  // ~20 KB: several buckets for this 116 KB model
    yuan::Replica model = ref.model([&](yuan::Replica& r) -> yuan::Communicator* {
      r.opts->add(std::make_unique<yuan::ZeroOptimizer>(oc, *r.backend, *ref.layout, *comm,
                                                        ref.params.data()));
      return nullptr;
    });
    yuan::Backend* be = model.backend.get();
    yuan::ZeroOptimizers& opt = *model.opts;
    for (int step = 0; step < ref.steps; step++) {
      float loss = model.program->forward_backward(ref.batch(step), ref.B, 1.0f, opt.ready_hook());
      opt.after_micro_batch();
      const double lr = yuan::lr_at(oc, step, ref.steps);
      const yuan::ZeroStepStats st = yuan::end_step(opt, *comm, lr, loss);
      EXPECT_LE(rel_err(loss, losses[step]), 1e-5) << "loss of step " << step;
      EXPECT_LE(rel_err(lr, lrs[step]), 1e-12) << "lr of step " << step;
      EXPECT_LE(rel_err(st.grad_norm, norms[step]), 1e-5) << "grad norm of step " << step;
    }
    EXPECT_EQ(opt.all().front()->adam_step(), ref.steps);
    std::vector<float> got(ref.layout->total());
    be->get_params(got.data(), 0, got.size());
    for (const auto& t : ref.layout->tensors())
      EXPECT_LE(rel_err(got.data() + t.offset, final_params.data() + t.offset, t.numel), 1e-5)
          << "parameter " << t.name << " after " << ref.steps << " steps";
  }
}

// ---- safetensors ----

class TempFile {
 public:
  TempFile() : path_(yuan::strf("/tmp/yuan_test_st_%d_%d.safetensors", static_cast<int>(getpid()), counter_++)) {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const yuan::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempFile f;
  const std::vector<float> f32 = {1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f};
  const std::vector<double> f64 = {M_PI, -1e-300};
  const std::vector<int32_t> i32 = {-7, 0, 2147483647};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 62), 5};
  const std::vector<uint16_t> bf16 = {yuan::f32_to_bf16(1.0f), yuan::f32_to_bf16(-3.5f)};
  const std::vector<uint16_t> u16 = {65535, 1, 2};
  const float scalar = 42.0f;
  SafetensorsWriter w;
  // An odd-sized U16 first: the writer must still place the wider tensors aligned.
  w.add("u16", "U16", {3}, u16.data());
  w.add_f32("m.f32", {2, 3}, f32.data());
  w.add_f64("f64", {2}, f64.data());
  w.add_i32("i32", {3}, i32.data());
  w.add_i64("i64", {1, 2}, i64.data());
  w.add_bf16("bf16", {2}, bf16.data());
  w.add_f32("scalar", {}, &scalar);
  w.add_f32("empty", {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  w.set_metadata("odd \"key\"", "back\\slash\nnew line, tab\t, ctrl \x01, utf-8 \xc3\xa9");
  w.write(f.path());
  struct stat st;
  EXPECT_NE(::stat((f.path() + ".tmp").c_str(), &st), 0) << "temporary file left behind";

  SafetensorsReader r(f.path());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"bf16", "empty", "f64", "i32", "i64", "m.f32", "scalar", "u16"}));
  EXPECT_EQ(r.read_f32("m.f32", {2, 3}), f32);
  EXPECT_EQ(r.read_f64("f64", {2}), f64);
  EXPECT_EQ(r.read_i32("i32", {3}), i32);
  EXPECT_EQ(r.read_i64("i64", {1, 2}), i64);
  EXPECT_EQ(r.read_f32("bf16", {2}), (std::vector<float>{1.0f, -3.5f}));
  EXPECT_EQ(r.read_i32("u16", {3}), (std::vector<int32_t>{65535, 1, 2}));
  EXPECT_EQ(r.read_f32("scalar", {}), std::vector<float>{42.0f});
  EXPECT_TRUE(r.read_f32("empty", {0, 4}).empty());
  EXPECT_EQ(r.info("m.f32").dtype, "F32");
  EXPECT_EQ(r.meta("format"), "pt");
  EXPECT_EQ(r.meta("odd \"key\""), "back\\slash\nnew line, tab\t, ctrl \x01, utf-8 \xc3\xa9");
  EXPECT_EQ(r.metadata().size(), 2u);

  // Layout: 8-byte length, header padded to 8, every tensor aligned to its element size.
  std::ifstream in(f.path(), std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  for (const auto& name : r.names())
    EXPECT_EQ(r.info(name).begin % yuan::safetensors_dtype_size(r.info(name).dtype), 0u) << name;
}

TEST(Safetensors, ConvertsFloatTypes) {
  TempFile f;
  // F16 bit patterns: 1, -2, the smallest subnormal 2^-24, +inf, 65504 (largest finite)
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x0001, 0x7C00, 0x7BFF};
  const std::vector<double> f64 = {0.1, -1e10};
  const std::vector<int64_t> big = {1, int64_t{1} << 40};
  SafetensorsWriter w;
  w.add("h", "F16", {5}, f16.data());
  w.add_f64("d", {2}, f64.data());
  w.add_i64("big", {2}, big.data());
  w.write(f.path());
  SafetensorsReader r(f.path());
  EXPECT_EQ(r.read_f32("h", {5}), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), INFINITY, 65504.0f}));
  EXPECT_EQ(r.read_f32("d", {2}), (std::vector<float>{0.1f, -1e10f}));
  EXPECT_EQ(r.read_i64("big", {2}), big);
  EXPECT_NE(error_of([&] { r.read_i32("big", {2}); }).find("'big' element 1"), std::string::npos);
  EXPECT_NE(error_of([&] { r.read_i32("d", {2}); }).find("expected an integer dtype"), std::string::npos);
  EXPECT_NE(error_of([&] { r.read_f32("big", {2}); }).find("expected a float dtype"), std::string::npos);
}

TEST(Safetensors, ErrorsNameTheFileAndTensor) {
  TempFile f;
  const std::vector<float> x(6, 1.0f);
  SafetensorsWriter w;
  w.add_f32("h.0.attn.c_attn.weight", {2, 3}, x.data());
  w.write(f.path());
  SafetensorsReader r(f.path());
  std::string e = error_of([&] { r.read_f32("h.0.attn.c_attn.weight", {3, 2}); });
  EXPECT_NE(e.find(f.path()), std::string::npos) << e;
  EXPECT_NE(e.find("'h.0.attn.c_attn.weight' has shape [2, 3], expected [3, 2]"), std::string::npos) << e;
  e = error_of([&] { r.info("wte.weight"); });
  EXPECT_NE(e.find(f.path() + ": no tensor 'wte.weight'"), std::string::npos) << e;
  e = error_of([&] { r.meta("n_layer"); });
  EXPECT_NE(e.find("no metadata key 'n_layer'"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { w.add_f32("h.0.attn.c_attn.weight", {1}, x.data()); }).find("added twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.add("q", "Q8", {1}, x.data()); }).find("unknown dtype 'Q8'"), std::string::npos);
  EXPECT_NE(error_of([] { SafetensorsReader("/nonexistent/x.safetensors"); }).find("/nonexistent/x.safetensors"),
            std::string::npos);

  // Damaged files: every one is an Error naming the file, never a crash.
  std::string good;
  {
    std::ifstream in(f.path(), std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto damaged = [&](const std::string& bytes) {
    std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
    return error_of([&] { SafetensorsReader{f.path()}; });
  };
  auto header = [](const std::string& json, size_t data_bytes) {
    uint64_t n = json.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + json + std::string(data_bytes, '\0');
  };
  for (const std::string& bytes : {
           good.substr(0, good.size() - 4),  // truncated data
           good.substr(0, 5),                // shorter than the length field
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4),
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),  // twice
           header("{\"a\":{\"dtype\":\"X9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8),
           header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8),  // unterminated
           header("[1, 2]", 0),
           header("{\"__metadata__\":{\"k\":1}}", 0),
           std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10),  // absurd header length
       }) {
    e = damaged(bytes);
    EXPECT_NE(e.find(f.path()), std::string::npos) << "no error naming the file, got: '" << e << "'";
  }
}

// The Python-written fixture parses with the expected entries (metadata first, wide dtypes first).
TEST(Safetensors, ReadsTheReferenceFixture) {
  SafetensorsReader r(kFixture);
  EXPECT_EQ(r.info("loss").dtype, "F64");
  EXPECT_TRUE(r.info("loss").shape.empty());
  EXPECT_EQ(r.info("tokens").dtype, "I32");
  EXPECT_EQ(r.meta("n_layer"), "2");
}

}  // namespace
