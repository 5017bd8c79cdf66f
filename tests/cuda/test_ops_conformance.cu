// Op conformance, as llama.cpp's test-backend-ops: every method of the op vocabulary (backend/ops_interface.h), called
// through the `Ops` interface of each backend the registry builds (cpu always; cuda with a device, which the
// emulator provides), on small random inputs, against the CPU backend as the reference. One table row per method
// (rows()), each with the shapes that reach its code paths; each (method, shape, backend) is its own test case.
//
// Coverage: the backend's ops are reached only through Recorder, an Ops that forwards every method of the
// interface and notes which ran. Its methods come from one list (YUAN_OPS_METHODS), so a method added to Ops makes
// Recorder abstract and this file stops compiling until the list names it; EveryMethodHasARow then fails until
// rows() has one for it, and each case checks that its row really called its method.
//
// Inputs are drawn in fp32 and rounded to bf16, so every backend computes from the same values whatever its
// formats. Outputs an op writes start as NaN (a forgotten element fails); gradients an op adds into start random
// (the accumulation is part of the contract). Metric (gpu_test.h): max|a - ref| / max|ref| over a tensor.
//
// Tolerances, stated once per activation dtype (tolerance()): an output is `r` roundings to that dtype away from
// the inputs on the path to it (its own store, and bf16 intermediates such as attention's probabilities or the
// GELU input), each within the unit roundoff u (bf16: 2^-8; fp32: 2^-24) of the value, and its fp32 reduction of
// `K` terms runs in another order than the reference's, within K * 2^-24 of it (the worst-case bound of a
// recursive sum). The sum of the two, doubled because the yardstick is the tensor's largest value and not each
// element's: 2 (r u + K 2^-24). The CPU backend is held to fp32's u against a second CPU backend running the same
// code, where it is in fact bitwise: there the cases check that every output is written, deterministically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/ops_interface.h"
#include "gpu_test.h"

namespace {

using namespace yuan::test;
using yuan::AttentionPath;
using yuan::Backend;
using yuan::Device;
using yuan::DType;
using yuan::Ops;
using yuan::Tensor;

// ---- every method of Ops: X(name, parameters, arguments) ----
#define YUAN_OPS_METHODS(X)                                                                                          \
  X(zero, (const Tensor& t), (t))                                                                                    \
  X(copy, (const Tensor& dst, const Tensor& src), (dst, src))                                                        \
  X(to_host_f32, (float* dst, const Tensor& src), (dst, src))                                                        \
  X(from_host_f32, (const Tensor& dst, const float* src), (dst, src))                                                \
  X(load_tokens, (const Tensor& tokens, const int32_t* host), (tokens, host))                                        \
  X(encoder_forward,                                                                                                 \
    (const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int B, int T, int64_t begin),    \
    (out, tokens, wte, wpe, B, T, begin))                                                                            \
  X(encoder_backward,                                                                                                \
    (const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens, int B, int T, int64_t begin), \
    (dwte, dwpe, dout, tokens, B, T, begin))                                                                         \
  X(layernorm_forward,                                                                                               \
    (const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in, const Tensor& w, const Tensor& b), \
    (out, mean, rstd, in, w, b))                                                                                     \
  X(layernorm_backward,                                                                                              \
    (const Tensor& dres, const Tensor& dres_op, const Tensor& dw, const Tensor& db, const Tensor& dout,              \
     const Tensor& in, const Tensor& w, const Tensor& mean, const Tensor& rstd),                                     \
    (dres, dres_op, dw, db, dout, in, w, mean, rstd))                                                                \
  X(matmul_forward,                                                                                                  \
    (const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias, const Tensor& residual,               \
     const Tensor& pre_gelu),                                                                                        \
    (out, in, w, bias, residual, pre_gelu))                                                                          \
  X(matmul_backward,                                                                                                 \
    (const Tensor& dinp, const Tensor& dw, const Tensor& dbias, const Tensor& dout, const Tensor& in,                \
     const Tensor& w, const Tensor& pre_gelu),                                                                       \
    (dinp, dw, dbias, dout, in, w, pre_gelu))                                                                        \
  X(bias_residual, (const Tensor& out, const Tensor& bias, const Tensor& residual), (out, bias, residual))           \
  X(attention_forward,                                                                                               \
    (const Tensor& out, const Tensor& state, const Tensor& scratch, const Tensor& qkv, int B, int T, int NH),        \
    (out, state, scratch, qkv, B, T, NH))                                                                            \
  X(attention_backward,                                                                                              \
    (const Tensor& dqkv, const Tensor& scratch, const Tensor& dout, const Tensor& qkv, const Tensor& out,            \
     const Tensor& state, int B, int T, int NH),                                                                     \
    (dqkv, scratch, dout, qkv, out, state, B, T, NH))                                                                \
  X(classifier, (const Tensor& logits, const Tensor& losses, const Tensor& tokens, int B, int T, float dscale),      \
    (logits, losses, tokens, B, T, dscale))                                                                          \
  X(classifier_row_max, (const Tensor& logits, const Tensor& row_max), (logits, row_max))                            \
  X(classifier_row_sums,                                                                                             \
    (const Tensor& logits, const Tensor& row_max, const Tensor& tokens, int B, int T, int64_t begin,                 \
     const Tensor& sums),                                                                                            \
    (logits, row_max, tokens, B, T, begin, sums))                                                                    \
  X(classifier_finish,                                                                                               \
    (const Tensor& logits, const Tensor& losses, const Tensor& row_max, const Tensor& sums, const Tensor& tokens,    \
     int B, int T, int64_t begin, float dscale),                                                                     \
    (logits, losses, row_max, sums, tokens, B, T, begin, dscale))                                                    \
  X(adamw,                                                                                                           \
    (const Tensor& master, const Tensor& m, const Tensor& v, const Tensor& grad, const Tensor& weights,              \
     const yuan::ops::AdamWHyper& h),                                                                                \
    (master, m, v, grad, weights, h))                                                                                \
  X(sum_squares, (const Tensor& x), (x))                                                                             \
  X(add, (const Tensor& dst, const Tensor& src), (dst, src))

// A backend's ops behind the interface, noting each method called.
class Recorder final : public Ops {
 public:
  explicit Recorder(Ops& inner) : inner_(inner) {}
#define YUAN_FORWARD(name, params, args)                                     \
  auto name params -> decltype(std::declval<Ops&>().name args) override { \
    called_.insert(#name);                                                 \
    return inner_.name args;                                               \
  }
  YUAN_OPS_METHODS(YUAN_FORWARD)
#undef YUAN_FORWARD
  bool called(const std::string& method) const { return called_.count(method) != 0; }

 private:
  Ops& inner_;
  std::set<std::string> called_;
};

const std::set<std::string>& ops_methods() {
#define YUAN_NAME(name, params, args) #name,
  static const std::set<std::string> names{YUAN_OPS_METHODS(YUAN_NAME)};
#undef YUAN_NAME
  return names;
}

// ---- shapes ----
enum Flag : unsigned {
  kBias = 1,         // matmul: with a bias
  kResidual = 2,     // matmul_forward: with a residual
  kGelu = 4,         // matmul: through GELU
  kLogits = 8,       // matmul: the classifier's [N, V] product, rows in the backend's padded logits stride
  kNoWpe = 16,       // encoder_forward: a tensor rank that does not add wpe
  kInputsOnly = 32,  // token rows of T ids, no targets (what forward_logits loads)
  kGrad = 64,        // classifier: dscale != 0, the gradient over the logits
};

// What a row reads of these depends on the op; C is also the backend's n_embd (its ops' scratch is sized by it).
struct Shape {
  std::string label;
  int B, T, C, NH;
  int V;           // wte rows, or logits columns, of this (tensor-parallel) part; matmul: OC
  int vocab;       // token ids are drawn from [0, vocab)
  int64_t begin;   // the first id of this part
  unsigned flags;
  int N() const { return B * T; }
};

// bf16 unit roundoff and fp32's; see the header comment.
double unit_roundoff(DType t) { return t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24); }
double tolerance(DType activations, int roundings, int reduction) {
  return 2 * (roundings * unit_roundoff(activations) + reduction * std::ldexp(1.0, -24));
}

// ---- one run of a row on one backend ----
struct Output {
  std::string name;
  Tensor t;
  int roundings = 0, reduction = 0;
  std::string ref;  // the reference's output it is compared with (default: the same name)
};

class Ctx {
 public:
  Ctx(Backend& be, Ops& ops) : be_(be), ops_(ops) {}
  Ops& ops() { return ops_; }
  const yuan::TensorFormats& formats() const { return be_.formats(); }
  // The attention's scratch on the backend's path, for heads of C / NH.
  Tensor attention_scratch(int B, int T, int C, int NH) {
    return scratch(formats().attention_scratch(B, T, NH, C / NH, be_.attention()));
  }
  DType act() const { return formats().activations; }
  DType wt() const { return formats().weights; }

  // Random values (mean, std), rounded to bf16 unless `exact`; their host copy in `host` when asked for. Padding
  // beyond cols in strided rows is NaN: an op that reads it into a result fails.
  Tensor input(DType t, int64_t rows, int64_t cols, float std, float mean = 0, std::vector<float>* host = nullptr,
               int64_t ld = 0, bool exact = false) {
    std::vector<float> v = randn(static_cast<size_t>(rows * cols), std, seed_++, mean);
    if (!exact) v = round_bf16(v);
    if (host) *host = v;
    return upload(t, rows, cols, v, ld);
  }
  Tensor values(DType t, int64_t rows, int64_t cols, const std::vector<float>& v) { return upload(t, rows, cols, v); }
  // An output the op writes: NaN until it does.
  Tensor poisoned(DType t, int64_t rows, int64_t cols, int64_t ld = 0) {
    return upload(t, rows, cols, std::vector<float>(rows * cols, std::numeric_limits<float>::quiet_NaN()), ld);
  }
  Tensor scratch(size_t floats) { return Tensor(alloc(floats * sizeof(float)), DType::F32, 1, floats); }
  // B rows of `stride` ids from [0, vocab), loaded by load_tokens into a token slot of the backend's size.
  Tensor tokens(int B, int T, int stride, int vocab, std::vector<int32_t>* host = nullptr) {
    std::mt19937 gen(seed_++);
    std::vector<int32_t> ids(static_cast<size_t>(B) * stride);
    for (int32_t& id : ids) id = static_cast<int32_t>(gen() % vocab);
    if (host) *host = ids;
    const size_t slot = std::max(formats().token_slot(B, T), ids.size());
    Tensor t(alloc(slot * sizeof(int32_t)), DType::I32, B, stride);
    ops_.load_tokens(t, ids.data());
    return t;
  }

  void out(const std::string& name, const Tensor& t, int roundings, int reduction, const std::string& ref = "") {
    outputs_.push_back({name, t, roundings, reduction, ref.empty() ? name : ref});
  }
  const std::vector<Output>& outputs() const { return outputs_; }

  // An output's values in fp32: through to_host_f32, or (token ids) copied out as they are.
  std::vector<float> download(const Tensor& t) {
    std::vector<float> v(t.numel());
    if (t.dtype != DType::I32) {
      ops_.to_host_f32(v.data(), t);
      return v;
    }
    std::vector<int32_t> ids(t.numel());
    raw(ids.data(), t.data, ids.size() * sizeof(int32_t), false);
    std::copy(ids.begin(), ids.end(), v.begin());
    return v;
  }

 private:
  void* alloc(size_t bytes) {
    mem_.push_back(be_.alloc(bytes, yuan::Mem::Activations));
    return mem_.back().as<void>();
  }
  // Host bytes to and from the backend's memory, outside the op vocabulary (it has no upload): the CPU backend's
  // memory is host memory, the CUDA backend's device memory, written after its stream has drained.
  void raw(void* dst, const void* src, size_t bytes, bool to_backend) {
    if (be_.device() == Device::Cpu) {
      std::memcpy(dst, src, bytes);
      return;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, to_backend ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
  }
  Tensor upload(DType t, int64_t rows, int64_t cols, const std::vector<float>& v, int64_t ld = 0) {
    if (!ld) ld = cols;
    const size_t n = static_cast<size_t>(rows * ld), w = yuan::dtype_size(t);
    std::vector<float> padded(n, std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < rows; r++) std::copy_n(v.begin() + r * cols, cols, padded.begin() + r * ld);
    std::vector<uint8_t> bytes(n * w);
    if (t == DType::BF16) {
      const std::vector<uint16_t> h = to_bf16(padded);
      std::memcpy(bytes.data(), h.data(), bytes.size());
    } else {
      std::memcpy(bytes.data(), padded.data(), bytes.size());
    }
    void* p = alloc(bytes.size());
    raw(p, bytes.data(), bytes.size(), true);
    return Tensor(p, t, rows, cols, ld);
  }

  Backend& be_;
  Ops& ops_;
  std::vector<yuan::Allocation> mem_;
  std::vector<Output> outputs_;
  uint32_t seed_ = 1;
};

// ---- host math for inputs that must agree with other inputs ----

// LayerNorm's saved statistics of rows of `in` (what layernorm_forward keeps), in double.
void layernorm_stats(const std::vector<float>& in, int N, int C, std::vector<float>& mean, std::vector<float>& rstd) {
  mean.assign(N, 0), rstd.assign(N, 0);
  for (int i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += in[i * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (in[i * C + c] - m) * (in[i * C + c] - m);
    mean[i] = static_cast<float>(m);
    rstd[i] = static_cast<float>(1 / std::sqrt(v / C + 1e-5));
  }
}

// What the all-reduces between the vocabulary-parallel passes would give: each row's maximum over every rank
// (this part's, or another rank's larger one), and the sums over the ranks of exp(z - max) and of the target's
// logit (another rank's share added to this part's).
void parallel_stats(const std::vector<float>& z, const std::vector<int32_t>& ids, const Shape& s,
                    std::vector<float>& row_max, std::vector<float>& sums) {
  const int N = s.N(), V = s.V;
  row_max.assign(N, 0), sums.assign(2 * static_cast<size_t>(N), 0);
  for (int i = 0; i < N; i++) {
    const float* row = z.data() + static_cast<size_t>(i) * V;
    const float m = *std::max_element(row, row + V) + (i % 2 ? 0.5f : 0.0f);
    double e = 0;
    for (int v = 0; v < V; v++) e += std::exp(row[v] - m);
    const int64_t y = ids[static_cast<size_t>(i / s.T) * (s.T + 1) + i % s.T + 1] - s.begin;
    row_max[i] = m;
    sums[i] = static_cast<float>(e + 0.75);
    sums[N + i] = y >= 0 && y < V ? row[y] : 1.25f;
  }
}

// ---- the rows: one per method ----
struct Row {
  const char* method;
  std::vector<Shape> shapes;
  void (*run)(Ctx&, const Shape&);
};

void run_zero(Ctx& c, const Shape& s) {
  const Tensor a = c.input(c.act(), s.N(), s.C, 1), f = c.input(DType::F32, s.N(), s.C, 1);
  c.ops().zero(a);
  c.ops().zero(f);
  c.out("act", a, 0, 0);
  c.out("f32", f, 0, 0);
}

void run_copy(Ctx& c, const Shape& s) {
  // fp32 values not representable in bf16 (the conversion rounds), bf16 values both ways, and a same-dtype copy.
  const Tensor f = c.input(DType::F32, s.N(), s.C, 1, 0, nullptr, 0, true), a = c.input(c.act(), s.N(), s.C, 1);
  const Tensor to_act = c.poisoned(c.act(), s.N(), s.C), to_f32 = c.poisoned(DType::F32, s.N(), s.C),
               same = c.poisoned(c.act(), s.N(), s.C);
  c.ops().copy(to_act, f);
  c.ops().copy(to_f32, a);
  c.ops().copy(same, a);
  c.out("f32_to_act", to_act, 1, 0);
  c.out("act_to_f32", to_f32, 0, 0);
  c.out("act_to_act", same, 0, 0);
}

void run_to_host_f32(Ctx& c, const Shape& s) {
  // Rows in the logits' padded stride, and dense fp32; download() reads them back through to_host_f32.
  c.out("logits", c.input(c.act(), s.N(), s.V, 2, 0, nullptr, c.formats().logits_ld(s.V)), 0, 0);
  c.out("f32", c.input(DType::F32, s.N(), s.C, 1), 0, 0);
}

void run_from_host_f32(Ctx& c, const Shape& s) {
  const std::vector<float> host = randn(static_cast<size_t>(s.N()) * s.C, 1, 7);
  const Tensor dst = c.poisoned(DType::F32, s.N(), s.C);
  c.ops().from_host_f32(dst, host.data());
  c.out("f32", dst, 0, 0);
}

void run_load_tokens(Ctx& c, const Shape& s) {
  c.out("ids", c.tokens(s.B, s.T, s.flags & kInputsOnly ? s.T : s.T + 1, s.vocab), 0, 0);
}

void run_encoder_forward(Ctx& c, const Shape& s) {
  const Tensor tok = c.tokens(s.B, s.T, s.flags & kInputsOnly ? s.T : s.T + 1, s.vocab);
  const Tensor wte = c.input(c.wt(), s.V, s.C, 0.3f), wpe = c.input(c.wt(), s.T + 3, s.C, 0.3f);
  const Tensor out = c.poisoned(c.act(), s.N(), s.C);
  c.ops().encoder_forward(out, tok, wte, s.flags & kNoWpe ? Tensor() : wpe, s.B, s.T, s.begin);
  c.out("out", out, 1, 2);
}

void run_encoder_backward(Ctx& c, const Shape& s) {
  const Tensor tok = c.tokens(s.B, s.T, s.T + 1, s.vocab);
  const Tensor dwte = c.input(DType::F32, s.V, s.C, 1), dwpe = c.input(DType::F32, s.T, s.C, 1);
  const Tensor dout = c.input(DType::F32, s.N(), s.C, 1);
  c.ops().encoder_backward(dwte, dwpe, dout, tok, s.B, s.T, s.begin);
  c.out("dwte", dwte, 0, s.N() + 1);
  c.out("dwpe", dwpe, 0, s.B + 1);
}

void run_layernorm_forward(Ctx& c, const Shape& s) {
  const Tensor in = c.input(c.act(), s.N(), s.C, 2, 0.5f);
  const Tensor w = c.input(c.wt(), 1, s.C, 0.1f, 1), b = c.input(c.wt(), 1, s.C, 0.1f);
  const Tensor out = c.poisoned(c.act(), s.N(), s.C), mean = c.poisoned(DType::F32, 1, s.N()),
               rstd = c.poisoned(DType::F32, 1, s.N());
  c.ops().layernorm_forward(out, mean, rstd, in, w, b);
  c.out("out", out, 1, s.C);
  c.out("mean", mean, 0, s.C);
  c.out("rstd", rstd, 0, s.C);
}

void run_layernorm_backward(Ctx& c, const Shape& s) {
  std::vector<float> x, mean, rstd;
  const Tensor in = c.input(c.act(), s.N(), s.C, 2, 0.5f, &x);
  layernorm_stats(x, s.N(), s.C, mean, rstd);
  const Tensor w = c.input(c.wt(), 1, s.C, 0.1f, 1), dout = c.input(c.act(), s.N(), s.C, 1);
  const Tensor dres = c.input(DType::F32, s.N(), s.C, 1);
  const Tensor dw = c.input(DType::F32, 1, s.C, 1), db = c.input(DType::F32, 1, s.C, 1);
  // The residual gradient's copy in the activation dtype exists where that is not fp32 (backend/ops_interface.h).
  const Tensor dres_op = c.act() == DType::F32 ? Tensor() : c.poisoned(c.act(), s.N(), s.C);
  c.ops().layernorm_backward(dres, dres_op, dw, db, dout, in, w, c.values(DType::F32, 1, s.N(), mean),
                             c.values(DType::F32, 1, s.N(), rstd));
  c.out("dres", dres, 0, 2 * s.C);
  if (dres_op) c.out("dres_op", dres_op, 1, 2 * s.C, "dres");
  c.out("dw", dw, 0, s.N() + 1);
  c.out("db", db, 0, s.N() + 1);
}

void run_matmul_forward(Ctx& c, const Shape& s) {
  const int N = s.N(), C = s.C, OC = s.V;
  const int64_t ld = s.flags & kLogits ? c.formats().logits_ld(OC) : 0;
  const Tensor in = c.input(c.act(), N, C, 1), w = c.input(c.wt(), OC, C, 1 / std::sqrt(static_cast<float>(C)));
  const Tensor bias = s.flags & kBias ? c.input(c.wt(), 1, OC, 0.1f) : Tensor();
  const Tensor residual = s.flags & kResidual ? c.input(c.act(), N, OC, 1) : Tensor();
  const Tensor pre_gelu = s.flags & kGelu ? c.poisoned(c.act(), N, OC) : Tensor();
  const Tensor out = c.poisoned(c.act(), N, OC, ld);
  c.ops().matmul_forward(out, in, w, bias, residual, pre_gelu);
  // With GELU, out is the GELU of the rounded pre_gelu: one more rounding on its path.
  c.out("out", out, pre_gelu ? 2 : 1, C + 2);
  if (pre_gelu) c.out("pre_gelu", pre_gelu, 1, C + 1);
}

void run_matmul_backward(Ctx& c, const Shape& s) {
  const int N = s.N(), C = s.C, OC = s.V;
  const int64_t ld = s.flags & kLogits ? c.formats().logits_ld(OC) : 0;
  const Tensor dout = c.input(c.act(), N, OC, 1, 0, nullptr, ld), in = c.input(c.act(), N, C, 1);
  const Tensor w = c.input(c.wt(), OC, C, 1 / std::sqrt(static_cast<float>(C)));
  const Tensor pre_gelu = s.flags & kGelu ? c.input(c.act(), N, C, 1.5f) : Tensor();
  const Tensor dw = c.input(DType::F32, OC, C, 1), dbias = s.flags & kBias ? c.input(DType::F32, 1, OC, 1) : Tensor();
  const Tensor dinp = c.poisoned(c.act(), N, C);
  c.ops().matmul_backward(dinp, dw, dbias, dout, in, w, pre_gelu);
  c.out("dinp", dinp, 1, OC);
  c.out("dw", dw, 0, N + 1);
  if (dbias) c.out("dbias", dbias, 0, N + 1);
}

void run_bias_residual(Ctx& c, const Shape& s) {
  const Tensor out = c.input(c.act(), s.N(), s.C, 1), bias = c.input(c.wt(), 1, s.C, 0.1f);
  c.ops().bias_residual(out, bias, c.input(c.act(), s.N(), s.C, 1));
  c.out("out", out, 1, 3);
}

// q and k of std 1.5 give peaked attention rows, which show a misplaced score; uniform ones hide it.
Tensor attention_forward(Ctx& c, const Shape& s, const Tensor& qkv, Tensor* state) {
  *state = c.scratch(c.formats().attention_state(s.B, s.T, s.NH));
  const Tensor out = c.poisoned(c.act(), s.N(), s.C);
  c.ops().attention_forward(out, *state, c.attention_scratch(s.B, s.T, s.C, s.NH), qkv, s.B, s.T, s.NH);
  return out;
}

void run_attention_forward(Ctx& c, const Shape& s) {
  Tensor state;
  // P is rounded to bf16 before P V, then out: two roundings.
  c.out("out", attention_forward(c, s, c.input(c.act(), s.N(), 3 * s.C, 1.5f), &state), 2, s.T);
}

void run_attention_backward(Ctx& c, const Shape& s) {
  // The state is each backend's own (probabilities on the CPU, logsumexp on CUDA): its forward makes it.
  Tensor state;
  const Tensor qkv = c.input(c.act(), s.N(), 3 * s.C, 1.5f), out = attention_forward(c, s, qkv, &state);
  const Tensor dout = c.input(c.act(), s.N(), s.C, 1), dqkv = c.poisoned(c.act(), s.N(), 3 * s.C);
  c.ops().attention_backward(dqkv, c.attention_scratch(s.B, s.T, s.C, s.NH), dout, qkv, out, state, s.B, s.T, s.NH);
  // P and dS enter the products as bf16, delta = rowsum(dO * O) reads the bf16 O, and dqkv is stored: four.
  c.out("dqkv", dqkv, 4, s.T + s.C / s.NH);
}

float dscale(const Shape& s) { return s.flags & kGrad ? 1.0f / s.N() : 0.0f; }

Tensor logits(Ctx& c, const Shape& s, std::vector<float>* host = nullptr) {
  return c.input(c.act(), s.N(), s.V, 2, 0, host, c.formats().logits_ld(s.V));
}

void run_classifier(Ctx& c, const Shape& s) {
  const Tensor tok = c.tokens(s.B, s.T, s.T + 1, s.vocab), z = logits(c, s);
  const Tensor losses = c.poisoned(DType::F32, 1, s.N());
  c.ops().classifier(z, losses, tok, s.B, s.T, dscale(s));
  c.out("losses", losses, 0, s.V);
  c.out("logits", z, s.flags & kGrad ? 1 : 0, s.V);  // unchanged without dscale
}

void run_classifier_row_max(Ctx& c, const Shape& s) {
  const Tensor z = logits(c, s), row_max = c.poisoned(DType::F32, 1, s.N());
  c.ops().classifier_row_max(z, row_max);
  c.out("row_max", row_max, 0, 0);
}

void run_classifier_row_sums(Ctx& c, const Shape& s) {
  std::vector<float> z, row_max, sums;
  std::vector<int32_t> ids;
  const Tensor tok = c.tokens(s.B, s.T, s.T + 1, s.vocab, &ids), zt = logits(c, s, &z);
  parallel_stats(z, ids, s, row_max, sums);
  const Tensor out = c.poisoned(DType::F32, 2, s.N());
  c.ops().classifier_row_sums(zt, c.values(DType::F32, 1, s.N(), row_max), tok, s.B, s.T, s.begin, out);
  c.out("sums", out, 0, s.V);
}

void run_classifier_finish(Ctx& c, const Shape& s) {
  std::vector<float> z, row_max, sums;
  std::vector<int32_t> ids;
  const Tensor tok = c.tokens(s.B, s.T, s.T + 1, s.vocab, &ids), zt = logits(c, s, &z);
  parallel_stats(z, ids, s, row_max, sums);
  const Tensor losses = c.poisoned(DType::F32, 1, s.N());
  c.ops().classifier_finish(zt, losses, c.values(DType::F32, 1, s.N(), row_max), c.values(DType::F32, 2, s.N(), sums),
                            tok, s.B, s.T, s.begin, dscale(s));
  c.out("losses", losses, 0, 1);
  c.out("logits", zt, s.flags & kGrad ? 1 : 0, 1);
}

// AdamW over N x C values (ops/adamw.h), its state and gradient exact fp32, with weight decay, a clipping scale
// and a step whose bias corrections matter; the working copy in the backend's weight dtype. fp32 outputs differ
// by the order of a few operations (fused multiply-adds): held to 2 x 8 x 2^-24 of their largest value.
void run_adamw(Ctx& c, const Shape& s) {
  const Tensor p = c.input(DType::F32, 1, s.N() * s.C, 1, 0, nullptr, 0, true),
               m = c.input(DType::F32, 1, s.N() * s.C, 0.1f, 0, nullptr, 0, true),
               v = c.input(DType::F32, 1, s.N() * s.C, 0.01f, 0.1f, nullptr, 0, true),  // 10 sigma above 0
               g = c.input(DType::F32, 1, s.N() * s.C, 0.5f, 0, nullptr, 0, true);
  const Tensor w = c.poisoned(c.wt(), 1, s.N() * s.C);
  yuan::ops::AdamWHyper h;
  h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.95, h.eps = 1e-8, h.weight_decay = 0.1, h.t = 3, h.grad_scale = 0.7;
  c.ops().adamw(p, m, v, g, w, h);
  c.out("master", p, 0, 8);
  c.out("m", m, 0, 8);
  c.out("v", v, 0, 8);
  c.out("weights", w, 1, 8);
}

// The sum of squares of N x C exact fp32 values, as a one-element tensor: K = N x C terms in another order.
void run_sum_squares(Ctx& c, const Shape& s) {
  const Tensor x = c.input(DType::F32, s.N(), s.C, 1, 0, nullptr, 0, true);
  const double sum = c.ops().sum_squares(x);
  c.out("sum", c.values(DType::F32, 1, 1, {static_cast<float>(sum)}), 0, s.N() * s.C);
}

// dst += src over N x C exact fp32 values: one rounding of the same sum on every backend, so the same bits.
void run_add(Ctx& c, const Shape& s) {
  const Tensor dst = c.input(DType::F32, 1, s.N() * s.C, 1, 0, nullptr, 0, true),
               src = c.input(DType::F32, 1, s.N() * s.C, 1, 0, nullptr, 0, true);
  c.ops().add(dst, src);
  c.out("dst", dst, 0, 0);
}

// Shapes: {label, B, T, C, NH, V, vocab, begin, flags}. C = 528 is the width above 512 where a kernel's grid
// takes a second dimension (the embedding backward's 128-thread blocks of 4 columns); sizes that are not
// multiples of 32 (or of the 64-row attention tile, or of the classifier's 16-byte vectors) reach the tails.
// "past_one_stride": just above the items one pass of a grid-stride loop covers on the target device (grid_for,
// cuda/common.cuh: 8 blocks per SM of 256 threads, 270,336 items on an H100, 221,184 on an A100), and above
// grad_norm.cu's 1024-block cap where it binds (an H100's 1056 blocks): 271,200 elements, or packs of 8 (bf16) or
// 4 (wpe's fp32), small in the other dimensions. "past_the_block_cap": above the 264 x 32 rows of the LayerNorm
// backward's capped grid. docs/EMULATOR.md, "Test shapes", has each kernel's thresholds.
const std::vector<Row>& rows() {
  // The head sizes the kernels pad to 16, 32, 64 and 128, one not a power of two, lengths across two 64-row tiles
  // and not a multiple of a tile, a single position.
  const std::vector<Shape> attention = {{"hs8", 2, 7, 32, 4, 0, 0, 0, 0},
                                        {"hs32_two_tiles", 1, 70, 64, 2, 0, 0, 0, 0},
                                        {"hs40", 1, 17, 80, 2, 0, 0, 0, 0},
                                        {"hs64", 1, 33, 64, 1, 0, 0, 0, 0},
                                        {"hs128", 1, 20, 256, 2, 0, 0, 0, 0},
                                        {"one_position", 2, 1, 64, 1, 0, 0, 0, 0}};
  const std::vector<Shape> layernorm = {
      {"small", 2, 3, 64, 1, 0, 0, 0, 0},
      {"odd", 1, 5, 72, 1, 0, 0, 0, 0},
      {"wide", 1, 3, 528, 1, 0, 0, 0, 0},
      {"past_the_block_cap", 1, 8449, 24, 1, 0, 0, 0, 0}};
  static const std::vector<Row> r = {
      {"zero", {{"small", 3, 5, 24, 1, 0, 0, 0, 0}}, run_zero},
      {"copy",
       {{"small", 3, 5, 24, 1, 0, 0, 0, 0},
        {"wide", 2, 3, 528, 1, 0, 0, 0, 0},
        {"past_one_stride", 8, 300, 113, 1, 0, 0, 0, 0}},
       run_copy},
      {"to_host_f32", {{"padded", 2, 3, 24, 1, 50, 0, 0, 0}}, run_to_host_f32},
      {"from_host_f32", {{"small", 3, 5, 24, 1, 0, 0, 0, 0}}, run_from_host_f32},
      {"load_tokens",
       {{"targets", 3, 7, 8, 1, 0, 50, 0, 0}, {"inputs_only", 2, 9, 8, 1, 0, 50, 0, kInputsOnly}},
       run_load_tokens},
      {"encoder_forward",
       {{"whole", 2, 5, 64, 1, 40, 40, 0, 0},
        {"tp_part_no_wpe", 2, 5, 64, 1, 16, 48, 16, kNoWpe},
        {"inputs_only", 2, 5, 64, 1, 40, 40, 0, kInputsOnly},
        {"wide", 1, 3, 528, 1, 20, 20, 0, 0},
        {"past_one_stride", 8, 300, 904, 1, 20, 20, 0, 0}},
       run_encoder_forward},
      {"encoder_backward",
       {{"whole", 2, 9, 64, 1, 12, 12, 0, 0},
        {"tp_part", 2, 9, 64, 1, 8, 24, 8, 0},
        {"tp_part_no_ids", 2, 5, 64, 1, 8, 8, 8, 0},
        {"wide", 2, 3, 528, 1, 6, 6, 0, 0},
        {"past_one_stride", 1, 1200, 904, 1, 6, 6, 0, 0}},
       run_encoder_backward},
      {"layernorm_forward", layernorm, run_layernorm_forward},
      {"layernorm_backward", layernorm, run_layernorm_backward},
      {"matmul_forward",
       {{"plain", 2, 5, 64, 1, 40, 0, 0, 0},
        {"bias", 2, 5, 64, 1, 40, 0, 0, kBias},
        {"bias_residual", 2, 5, 64, 1, 40, 0, 0, kBias | kResidual},
        {"gelu", 2, 5, 64, 1, 72, 0, 0, kBias | kGelu},
        {"logits", 2, 5, 64, 1, 50, 0, 0, kLogits},
        {"wide", 1, 3, 528, 1, 136, 0, 0, kBias}},
       run_matmul_forward},
      {"matmul_backward",
       {{"unbiased", 2, 5, 64, 1, 40, 0, 0, 0},
        {"bias", 2, 5, 64, 1, 40, 0, 0, kBias},
        {"gelu", 2, 5, 64, 1, 72, 0, 0, kBias | kGelu},
        {"logits", 2, 5, 64, 1, 50, 0, 0, kLogits},
        {"wide", 1, 3, 136, 1, 528, 0, 0, kBias}},
       run_matmul_backward},
      {"bias_residual",
       {{"small", 2, 5, 64, 1, 0, 0, 0, 0},
        {"wide", 1, 3, 528, 1, 0, 0, 0, 0},
        {"past_one_stride", 8, 300, 904, 1, 0, 0, 0, 0}},
       run_bias_residual},
      {"attention_forward", attention, run_attention_forward},
      {"attention_backward", attention, run_attention_backward},
      {"classifier",
       {{"loss", 2, 3, 8, 1, 50, 50, 0, 0},
        {"grad", 2, 3, 8, 1, 50, 50, 0, kGrad},
        {"wide_vocab_grad", 1, 2, 8, 1, 4100, 4100, 0, kGrad}},
       run_classifier},
      {"classifier_row_max", {{"small", 2, 3, 8, 1, 50, 0, 0, 0}, {"wide_vocab", 1, 2, 8, 1, 4100, 0, 0, 0}},
       run_classifier_row_max},
      {"classifier_row_sums",
       {{"tp_part", 2, 3, 8, 1, 24, 64, 24, 0}, {"wide_vocab", 1, 2, 8, 1, 4100, 8200, 0, 0}},
       run_classifier_row_sums},
      {"classifier_finish",
       {{"tp_part_loss", 2, 3, 8, 1, 24, 64, 24, 0},
        {"tp_part_grad", 2, 3, 8, 1, 24, 64, 24, kGrad},
        {"wide_vocab_grad", 1, 2, 8, 1, 4100, 8200, 4100, kGrad}},
       run_classifier_finish},
      // Sizes off the kernels' vector and block widths, and one over several blocks.
      {"adamw", {{"small", 1, 3, 41, 1, 0, 0, 0, 0}, {"past_one_stride", 8, 300, 113, 1, 0, 0, 0, 0}}, run_adamw},
      {"sum_squares",
       {{"small", 1, 3, 41, 1, 0, 0, 0, 0}, {"past_one_stride", 8, 300, 113, 1, 0, 0, 0, 0}},
       run_sum_squares},
      {"add", {{"small", 1, 3, 41, 1, 0, 0, 0, 0}, {"past_one_stride", 8, 300, 113, 1, 0, 0, 0, 0}}, run_add},
  };
  return r;
}

// ---- backends, one per (device, width, attention path), kept for the whole suite ----
struct Backends {
  std::map<std::tuple<Device, int, bool, AttentionPath>, std::unique_ptr<Backend>> made;
  // A backend whose ops are sized for width C, with no parameters: the ops run on memory from alloc().
  Backend& get(Device d, int C, bool reference, AttentionPath attention = AttentionPath::Own) {
    std::unique_ptr<Backend>& be = made[{d, C, reference, attention}];
    if (!be) be = yuan::make_backend(d, {0, false, C, attention});
    return *be;
  }
};
Backends& backends() {
  static Backends b;
  return b;
}

struct Case {
  int row, shape;
  Device device;
  AttentionPath attention = AttentionPath::Own;
};

// Every row on every backend (but the GPU's grid sizes); the attention rows on CUDA once more through cuDNN where the build has it, at the
// shapes cuDNN takes (choose_attention leaves a single position to own's kernels).
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Device d : {Device::Cpu, Device::Cuda})
    for (size_t r = 0; r < rows().size(); r++)
      for (size_t s = 0; s < rows()[r].shapes.size(); s++) {
        // The "past_" shapes are sized for the GPU's grids; the CPU backend has no such path (it still computes
        // the CUDA case's reference).
        if (d == Device::Cpu && rows()[r].shapes[s].label.rfind("past_", 0) == 0) continue;
        cases.push_back({static_cast<int>(r), static_cast<int>(s), d});
#ifdef YUAN_CUDNN
        if (d == Device::Cuda && std::string(rows()[r].method).rfind("attention_", 0) == 0 && rows()[r].shapes[s].T > 1)
          cases.push_back({static_cast<int>(r), static_cast<int>(s), d, AttentionPath::Cudnn});
#endif
      }
  return cases;
}

// One row on one backend: its outputs (with their tolerances' terms) and their values in fp32.
struct Result {
  std::vector<Output> outputs;  // the tensors are gone with the run; the names and terms stay
  std::vector<std::vector<float>> values;
  bool called = false;  // whether the row reached its method
};
Result run_row(Backend& be, const Row& row, const Shape& s) {
  Recorder rec(be.ops());
  Ctx c(be, rec);
  row.run(c, s);
  Result r{c.outputs(), {}, false};
  for (const Output& o : r.outputs) r.values.push_back(c.download(o.t));
  r.called = rec.called(row.method);  // after the downloads, which are to_host_f32's row
  return r;
}

class OpsConformance : public testing::TestWithParam<Case> {
 protected:
  static void TearDownTestSuite() { backends().made.clear(); }
};

TEST_P(OpsConformance, MatchesTheCpuReference) {
  const Case& k = GetParam();
  if (k.device == Device::Cuda) YUAN_REQUIRE_GPU();
  const Row& row = rows()[k.row];
  const Shape& s = row.shapes[k.shape];
  Backend& be = backends().get(k.device, s.C, false, k.attention);
  const Result ref = run_row(backends().get(Device::Cpu, s.C, true), row, s), got = run_row(be, row, s);
  ASSERT_TRUE(ref.called && got.called) << "the row of " << row.method << " does not call it";
  ASSERT_FALSE(got.outputs.empty()) << row.method << ": a row compares at least one output";
  for (size_t i = 0; i < got.outputs.size(); i++) {
    const Output& o = got.outputs[i];
    const auto r =
        std::find_if(ref.outputs.begin(), ref.outputs.end(), [&](const Output& x) { return x.name == o.ref; });
    ASSERT_NE(r, ref.outputs.end()) << o.name << ": the reference has no output " << o.ref;
    const double tol = tolerance(be.formats().activations, o.roundings, o.reduction);
    EXPECT_LE(rel_err(got.values[i], ref.values[r - ref.outputs.begin()]), tol)
        << row.method << " " << s.label << " on " << be.name() << ": output " << o.name << " (tolerance " << tol
        << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpsConformance, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<Case>& i) {
                           const Row& r = rows()[i.param.row];
                           return std::string(r.method) + "_" + r.shapes[i.param.shape].label + "_" +
                                  yuan::device_name(i.param.device) +
                                  (i.param.attention == AttentionPath::Cudnn ? "_cudnn" : "");
                         });

// A method of Ops with no row (or a row for a method Ops does not have) fails here.
TEST(OpsConformanceTable, EveryMethodHasARow) {
  std::set<std::string> covered;
  for (const Row& r : rows()) {
    EXPECT_TRUE(covered.insert(r.method).second) << "two rows for " << r.method;
    EXPECT_FALSE(r.shapes.empty()) << r.method << " has no shapes";
  }
  for (const std::string& m : ops_methods()) EXPECT_TRUE(covered.count(m)) << "Ops::" << m << " has no row";
  for (const std::string& m : covered) EXPECT_TRUE(ops_methods().count(m)) << m << " is not a method of Ops";
}

}  // namespace
