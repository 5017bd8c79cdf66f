// Data parallelism over MPI: the world, the MPI communicator's collectives, and the ZeRO optimizer (stages 0, 1,
// 2, its offload pipeline and the delayed update) checked against a serial computation of the same training
// steps. Suites are named Mpi* so the runner executes them under mpirun with 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "comm/mpi_check.h"
#include "comm/world.h"
#include "ops/adamw.h"
#include "optim/zero.h"
#include "util/memory.h"

namespace yuan {
namespace {

int rank() { return comm::world().rank; }
int nranks() { return comm::world().size; }

// The world as a process group, for communicators over every rank.
const comm::ProcessGroup& world_group() {
  static const comm::ProcessGroups groups(layout::Topology::data_parallel(nranks(), 3, 1));
  return groups.get(comm::Group::World);
}
std::unique_ptr<Communicator> world_communicator(size_t max_count = INT_MAX) {
  return comm::make_mpi_communicator(world_group(), max_count);
}

// ---------------------------------------------------------------------------------------------------------------
// World

TEST(MpiWorld, InfoMatchesMpi) {
  ASSERT_TRUE(comm::initialized());
  int r = -1, n = -1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  const comm::WorldInfo& w = comm::world();
  EXPECT_EQ(w.rank, r);
  EXPECT_EQ(w.size, n);
  EXPECT_GE(w.local_rank, 0);
  EXPECT_LT(w.local_rank, w.local_size);
  EXPECT_LE(w.local_size, w.size);
  EXPECT_FALSE(w.host.empty());
  EXPECT_EQ(process_rank(), r);
  EXPECT_EQ(process_host(), w.host);
  EXPECT_EQ(comm::allreduce_sum(r + 1.0), n * (n + 1) / 2.0);
  EXPECT_EQ(comm::allreduce_max(static_cast<double>(r)), n - 1.0);
}

// Every rank must throw the same collective error, naming the first rank that differs from rank 0.
void expect_mismatch_names(uint64_t value, int first_bad) {
  try {
    comm::check_same_everywhere(value, "test value");
    ADD_FAILURE() << "no error although rank " << first_bad << " differs";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    std::string msg = e.what();
    EXPECT_NE(msg.find("test value"), std::string::npos) << msg;
    EXPECT_NE(msg.find(strf("rank %d@", first_bad)), std::string::npos) << msg;
  }
}

TEST(MpiWorld, CheckSameEverywhereNamesTheDifferingRank) {
  EXPECT_NO_THROW(comm::check_same_everywhere(0xC0FFEEull, "config hash"));
  if (nranks() == 1) return;  // nothing can differ
  expect_mismatch_names(rank() == nranks() - 1 ? 2 : 1, nranks() - 1);
  expect_mismatch_names(rank() >= 1 ? 7 : 3, 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Communicator

// Exact in every dtype, and distinct per rank and element.
template <typename T>
T value(int r, size_t i) {
  return static_cast<T>((r + 1) * 3 + static_cast<int>(i % 11));
}
template <>
uint64_t value<uint64_t>(int r, size_t i) {
  return (uint64_t(1) << 58) + uint64_t(r + 1) * 1000 + i;  // beyond double's 53 bits
}

template <typename T>
T sum_over_ranks(size_t i) {
  T s = 0;
  for (int r = 0; r < nranks(); r++) s += value<T>(r, i);
  return s;
}

// One plain communicator and one that splits every call into chunks of 5 elements.
std::vector<std::unique_ptr<Communicator>> communicators() {
  std::vector<std::unique_ptr<Communicator>> out;
  out.push_back(world_communicator());
  out.push_back(world_communicator(5));
  return out;
}

// Uneven, with an empty block at every third rank from 2, so that every world size >= 2 has a rank whose block
// does not start at 0 (in-place reduce-scatter results must be moved there).
std::vector<size_t> uneven_counts() {
  std::vector<size_t> c(static_cast<size_t>(nranks()));
  for (int r = 0; r < nranks(); r++) c[r] = r % 3 == 2 ? 0 : 3 * r + 4;
  return c;
}

template <typename T>
void check_all_reduce(Communicator& comm, DType t) {
  const size_t n = 37;
  std::vector<T> buf(n);
  for (size_t i = 0; i < n; i++) buf[i] = value<T>(comm.rank(), i);
  comm.all_reduce(buf.data(), n, t, ReduceOp::Sum);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(buf[i], sum_over_ranks<T>(i)) << "sum, element " << i;
  for (size_t i = 0; i < n; i++) buf[i] = value<T>(comm.rank(), i);
  comm.all_reduce(buf.data(), n, t, ReduceOp::Max);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(buf[i], value<T>(comm.size() - 1, i)) << "max, element " << i;
}

TEST(MpiCommunicator, AllReduceEveryDType) {
  for (auto& comm : communicators()) {
    EXPECT_EQ(comm->rank(), rank());
    EXPECT_EQ(comm->size(), nranks());
    check_all_reduce<float>(*comm, DType::F32);
    check_all_reduce<double>(*comm, DType::F64);
    check_all_reduce<int32_t>(*comm, DType::I32);
    check_all_reduce<uint64_t>(*comm, DType::U64);
    uint16_t bf[4] = {};
    EXPECT_THROW(comm->all_reduce(bf, 4, DType::BF16, ReduceOp::Sum), Error);
  }
}

template <typename T>
void check_reduce_scatter(Communicator& comm, DType t) {
  std::vector<size_t> counts = uneven_counts();
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  size_t off = std::accumulate(counts.begin(), counts.begin() + comm.rank(), size_t(0));
  std::vector<T> buf(total);
  for (size_t i = 0; i < total; i++) buf[i] = value<T>(comm.rank(), i);
  comm.reduce_scatter(buf.data(), counts, t);
  for (size_t i = off; i < off + counts[comm.rank()]; i++) ASSERT_EQ(buf[i], sum_over_ranks<T>(i)) << i;
}

TEST(MpiCommunicator, ReduceScatterUnevenCounts) {
  for (auto& comm : communicators()) {
    check_reduce_scatter<float>(*comm, DType::F32);
    check_reduce_scatter<double>(*comm, DType::F64);
    check_reduce_scatter<int32_t>(*comm, DType::I32);
    check_reduce_scatter<uint64_t>(*comm, DType::U64);
  }
}

template <typename T>
void check_all_gather(Communicator& comm, DType t) {
  std::vector<size_t> counts = uneven_counts();
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  std::vector<T> buf(total, static_cast<T>(99));
  std::vector<int> owner(total);
  for (size_t r = 0, i = 0; r < counts.size(); r++)
    for (size_t k = 0; k < counts[r]; k++, i++) {
      owner[i] = static_cast<int>(r);
      if (owner[i] == comm.rank()) buf[i] = value<T>(comm.rank(), i);
    }
  comm.all_gather(buf.data(), counts, t);
  for (size_t i = 0; i < total; i++) ASSERT_EQ(buf[i], value<T>(owner[i], i)) << i;
}

TEST(MpiCommunicator, AllGatherUnevenCounts) {
  for (auto& comm : communicators()) {
    check_all_gather<float>(*comm, DType::F32);
    check_all_gather<double>(*comm, DType::F64);
    check_all_gather<int32_t>(*comm, DType::I32);
    check_all_gather<uint64_t>(*comm, DType::U64);
    check_all_gather<uint16_t>(*comm, DType::BF16);  // raw 2-byte words
  }
}

TEST(MpiCommunicator, BroadcastFromLastRank) {
  for (auto& comm : communicators()) {
    const size_t n = 1001;
    const int root = comm->size() - 1;
    std::vector<double> buf(n, -1.0);
    if (comm->rank() == root)
      for (size_t i = 0; i < n; i++) buf[i] = value<double>(root, i);
    comm->broadcast(buf.data(), n, DType::F64, root);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(buf[i], value<double>(root, i)) << i;
    comm->barrier();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// ZeRO

// 2 layers, C = 5, T = 4, V = 9: 805 parameters, so the shards are uneven for 2, 3, 4 ranks.
GPTConfig tiny_config() { return GPTConfig{2, 1, 5, 4, 9}; }
constexpr int kRows = 2;  // per micro-batch and rank

// Test double of a GPT replica: loss of a row = 0.5 * sum_i a_i (p_i - x_i(row))^2, with x a fixed function of the
// row's tokens, so gradients depend on the batch and their mean over the global batch is known in closed form.
// Flat fp32 host buffers; backward visits the modules in reverse layout order and reports each one finished.
class QuadraticBackend : public CpuBackend {
 public:
  explicit QuadraticBackend(const GPTConfig& c) : CpuBackend(backend_spec(ParamLayout(c))), layout_(c) {}
  const ParamLayout& layout() const { return layout_; }

  static double curvature(size_t i) { return 0.5 + 0.25 * static_cast<double>(i % 5); }
  static double target(const int32_t* row, size_t i, int T) {
    return std::sin(0.37 * static_cast<double>(i) + 0.9 * row[i % (T + 1)]);
  }

  virtual ~QuadraticBackend() = default;
  // Adds grad_scale times the gradient of the mean loss of B rows into the gradients; returns the mean loss.
  virtual float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) {
    const int T = layout().config().seq_len;
    double loss = 0;
    for (int m = static_cast<int>(layout().modules().size()) - 1; m >= 0; m--) {
      const ModuleSpec& mod = layout().modules()[m];
      for (size_t i = mod.offset; i < mod.offset + mod.numel; i++) {
        double g = 0;
        for (int b = 0; b < B; b++) {
          double d = param_mem_[i] - target(tokens + b * (T + 1), i, T);
          g += curvature(i) * d;
          loss += 0.5 * curvature(i) * d * d;
        }
        grad_mem_[i] += static_cast<float>(grad_scale * g / B);
      }
      if (ready) ready(mod.index);
    }
    return static_cast<float>(loss / B);
  }

 private:
  const ParamLayout layout_;
};

// The offload pipeline's view of a GPU, on the host: working weights in f32 or bf16, and the asynchronous
// transfers of backend.h deferred to the wait that the contract names (gradient copies to wait_transfers,
// uploads to wait_upload), reading their source only then. An optimizer that reads a host gradient before
// waiting, or refills a staging buffer whose upload is still in flight, computes with stale values and fails
// the comparison with the serial run. Compute and zero_grads run after pending transfers, as on the GPU.
// Thread-safe as a device backend is: the delayed update's thread waits for the uploads (HostAdamW::update)
// while the training thread enqueues more and computes, so the queues and what flushing them writes are
// guarded (without it, the two threads' pushes and flushes of one queue corrupted the heap, at 4 ranks on 2 cores).
class DeferredBackend final : public QuadraticBackend {
 public:
  DeferredBackend(const GPTConfig& c, DType working)
      : QuadraticBackend(c), working_(working), bf16_(working == DType::BF16 ? size() : 0) {
    if (working == DType::BF16) weights_ = Tensor(bf16_.data(), DType::BF16, 1, static_cast<int64_t>(size()));
  }

  void set_params(const float* src, size_t off, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    flush_all();
    CpuBackend::set_params(src, off, n);
    for (size_t i = 0; i < bf16_.size() && i < n; i++) bf16_[off + i] = f32_to_bf16(src[i]);
  }
  void get_params(float* dst, size_t off, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    compute_view();
    CpuBackend::get_params(dst, off, n);
  }
  float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      compute_view();
    }
    return QuadraticBackend::forward_backward(tokens, B, grad_scale, ready);
  }
  void zero_grads(size_t off, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    run(copies_);
    CpuBackend::zero_grads(off, n);
  }
  void to_host_async(float* dst, const Tensor& src, DeviceStream) override {
    std::lock_guard<std::mutex> lock(mu_);
    copies_.push_back([dst, src] { std::memcpy(dst, src.data, src.numel() * sizeof(float)); });
  }
  void wait_transfers() override {
    std::lock_guard<std::mutex> lock(mu_);
    run(copies_);
  }
  void params_from_host_async(const void* src, size_t off, size_t n, int lane) override {
    check_range(off, n);
    ASSERT_TRUE(lane == 0 || lane == 1) << lane;
    char* dst = working_ == DType::BF16 ? reinterpret_cast<char*>(bf16_.data() + off)
                                        : reinterpret_cast<char*>(param_mem_.data() + off);
    const size_t bytes = n * dtype_size(working_);
    std::lock_guard<std::mutex> lock(mu_);
    uploads_[lane].push_back([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  void wait_upload(int lane) override {
    std::lock_guard<std::mutex> lock(mu_);
    run(uploads_[lane]);
  }

 private:
  using Queue = std::vector<std::function<void()>>;
  static void run(Queue& q) {
    for (auto& f : q) f();
    q.clear();
  }
  void flush_all() {
    run(copies_);
    for (Queue& q : uploads_) run(q);
  }
  // What compute reads: the working weights after every transfer, as the values the bf16 words stand for.
  void compute_view() {
    flush_all();
    for (size_t i = 0; i < bf16_.size(); i++) param_mem_[i] = bf16_to_f32(bf16_[i]);
  }
  DType working_;
  std::vector<uint16_t> bf16_;
  std::mutex mu_;  // the queues, and the weights their flushing writes
  Queue copies_, uploads_[2];
};

// Rows of the global batch: step s, rank r, micro-batch k.
std::vector<int32_t> batch_tokens(int s, int r, int k) {
  const GPTConfig c = tiny_config();
  std::vector<int32_t> tok(static_cast<size_t>(kRows) * (c.seq_len + 1));
  for (size_t j = 0; j < tok.size(); j++) tok[j] = static_cast<int32_t>((s * 131 + r * 71 + k * 29 + j * 7) % c.vocab_size);
  return tok;
}

std::vector<float> initial_params(size_t n) {
  std::vector<float> p(n);
  for (size_t i = 0; i < n; i++) p[i] = (i % 2 ? -1.0f : 1.0f) * (0.5f + static_cast<float>((i * 37) % 100) / 100.0f);
  return p;
}

double lr_at(int step) { return 1e-2 * (1.0 + 0.5 * step); }



struct Trajectory {
  std::vector<float> params;
  std::vector<double> norms;
};

// How run_zero drives the optimizer: the plain host backend, or the deferred one with f32 or bf16 weights; with
// or without announcing the last micro-batch.
struct Drive {
  bool deferred = false;
  DType working = DType::F32;
  bool announce_last = false;
};

Trajectory run_zero(const OptimConfig& oc, int accum, int steps, const Drive& drive = {}) {
  ParamLayout layout(tiny_config());
  std::unique_ptr<QuadraticBackend> owned =
      drive.deferred ? std::make_unique<DeferredBackend>(tiny_config(), drive.working)
                     : std::make_unique<QuadraticBackend>(tiny_config());
  QuadraticBackend& be = *owned;
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(layout.total());
  ZeroOptimizer opt(oc, be, be.layout(), *comm, init.data());
  Trajectory out;
  for (int s = 0; s < steps; s++) {
    for (int k = 0; k < accum; k++) {
      if (drive.announce_last && k == accum - 1) opt.before_last_micro_batch();
      std::vector<int32_t> tok = batch_tokens(s, rank(), k);
      be.forward_backward(tok.data(), kRows, 1.0f / static_cast<float>(nranks() * accum), opt.ready_hook());
      opt.after_micro_batch();
    }
    ZeroStepStats st = end_step(opt, *comm, lr_at(s));
    out.norms.push_back(st.grad_norm);
    std::vector<float> g(be.size());
    be.grads_to_host(0, g.size(), g.data());
    for (size_t i = 0; i < g.size(); i++) EXPECT_EQ(g[i], 0.0f) << "gradient left after step " << s << " at " << i;
  }
  opt.drain();
  out.params.resize(be.size());
  be.get_params(out.params.data(), 0, out.params.size());
  return out;
}

// The same steps on one process: the mean gradient over all ranks' and micro-batches' rows in double, clipped by
// its norm, then the AdamW kernel tensor by tensor. The gradient is taken at the weights the backend computes
// with: rounded to bf16 for `working` bf16, and with oc.delayed_update those from before the previous update
// (w_t = AdamW(w_{t-1}, grad at w_{t-2}), the initial weights for the first two steps).
Trajectory run_serial(const OptimConfig& oc, int accum, int steps, DType working = DType::F32) {
  ParamLayout layout(tiny_config());
  const size_t n = layout.total();
  const int T = tiny_config().seq_len;
  std::vector<float> p = initial_params(n), m(n, 0.0f), v(n, 0.0f), g(n);
  auto as_computed = [&](std::vector<float> w) {
    if (working == DType::BF16)
      for (float& x : w) x = bf16_to_f32(f32_to_bf16(x));
    return w;
  };
  std::vector<float> seen = as_computed(p);  // the weights forward and backward use
  Trajectory out;
  for (int s = 0; s < steps; s++) {
    std::vector<double> gd(n, 0.0);
    for (int r = 0; r < nranks(); r++)
      for (int k = 0; k < accum; k++) {
        std::vector<int32_t> tok = batch_tokens(s, r, k);
        for (int b = 0; b < kRows; b++)
          for (size_t i = 0; i < n; i++)
            gd[i] += QuadraticBackend::curvature(i) *
                     (seen[i] - QuadraticBackend::target(tok.data() + b * (T + 1), i, T));
      }
    if (oc.delayed_update) seen = as_computed(p);  // the update below lands one step late
    double norm2 = 0;
    for (size_t i = 0; i < n; i++) {
      gd[i] /= nranks() * accum * kRows;
      norm2 += gd[i] * gd[i];
      g[i] = static_cast<float>(gd[i]);
    }
    double norm = std::sqrt(norm2);
    out.norms.push_back(norm);
    ops::AdamWHyper h = adamw_hyper(oc, lr_at(s), s + 1, norm);
    for (const TensorSpec& t : layout.tensors()) {
      h.weight_decay = t.decay ? oc.weight_decay : 0.0;
      ops::adamw_update(&p[t.offset], &m[t.offset], &v[t.offset], &g[t.offset], nullptr, t.numel, h);
    }
    if (!oc.delayed_update) seen = as_computed(p);
  }
  out.params = as_computed(p);
  return out;
}

OptimConfig optim_config(int stage, double bucket_mb, double grad_clip) {
  OptimConfig oc;
  oc.zero = ZeroStage(stage);
  oc.bucket_mb = bucket_mb;
  oc.grad_clip = grad_clip;
  oc.weight_decay = 0.1;
  return oc;
}

// `tol`: relative, per value.
void expect_same_run(const Trajectory& got, const Trajectory& want, const std::string& what, double tol = 1e-6) {
  ASSERT_EQ(got.norms.size(), want.norms.size());
  for (size_t s = 0; s < want.norms.size(); s++)
    EXPECT_NEAR(got.norms[s], want.norms[s], tol * want.norms[s]) << what << ": norm of step " << s;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); i++)
    ASSERT_NEAR(got.params[i], want.params[i], tol * std::abs(want.params[i])) << what << ": param " << i;
}

TEST(MpiZero, StagesMatchSerialMeanGradient) {
  // bucket_mb: every module alone, ~1 KiB buckets (three of uneven size), one bucket for everything.
  for (int accum : {1, 3}) {
    Trajectory want = run_serial(optim_config(0, 0, 0), accum, 3);
    for (int stage : {0, 1, 2})
      for (double mb : {0.0, 0.001, 100.0}) {
        Trajectory got = run_zero(optim_config(stage, mb, 0), accum, 3);
        expect_same_run(got, want, strf("zero %d, bucket_mb %g, accum %d, %d ranks", stage, mb, accum, nranks()));
      }
  }
}

TEST(MpiZero, ClippingUsesTheGlobalNorm) {
  // The mean gradient's norm is ~10 here, so a clip of 1 scales every step; a rank-local norm would show in both
  // the reported norm and the weights.
  for (int accum : {1, 2}) {
    Trajectory want = run_serial(optim_config(0, 0, 1.0), accum, 3);
    ASSERT_GT(want.norms[0], 2.0);
    for (int stage : {0, 1, 2}) {
      Trajectory got = run_zero(optim_config(stage, 0.001, 1.0), accum, 3);
      expect_same_run(got, want, strf("clipped, zero %d, accum %d, %d ranks", stage, accum, nranks()));
    }
  }
}

TEST(MpiZero, OffloadPipelineMatchesSerial) {
  // Every transfer deferred to its wait; reductions at step() or during the last backward; one tile per module,
  // uneven tiles, one tile for everything.
  for (int accum : {1, 3}) {
    Trajectory want = run_serial(optim_config(0, 0, 1.0), accum, 3);
    for (int stage : {0, 1, 2})
      for (double mb : {0.0, 0.001, 100.0})
        for (bool announce : {false, true}) {
          Trajectory got = run_zero(optim_config(stage, mb, 1.0), accum, 3, {true, DType::F32, announce});
          expect_same_run(got, want, strf("deferred f32, zero %d, bucket_mb %g, accum %d, last announced %d, %d ranks",
                                          stage, mb, accum, announce, nranks()));
        }
  }
}

// With bf16 working weights the gradient depends on how the weights round, so a sum over ranks in another order
// than the serial one can move a weight across a bf16 rounding boundary: exact on one rank, and on more within
// a bound that still catches a lost or unapplied update (a step is ~lr = 1e-2).
TEST(MpiZero, OffloadPipelineBf16MatchesSerial) {
  const double tol = nranks() == 1 ? 1e-6 : 1e-2;
  for (bool delayed : {false, true}) {
    OptimConfig ref = optim_config(0, 0, 0);
    ref.delayed_update = delayed;
    Trajectory want = run_serial(ref, 1, 4, DType::BF16);
    for (int stage : {0, 1, 2})
      for (double mb : {0.001, 100.0}) {
        OptimConfig oc = optim_config(stage, mb, 0);
        oc.delayed_update = delayed;
        Trajectory got = run_zero(oc, 1, 4, {true, DType::BF16, true});
        expect_same_run(got, want, strf("deferred bf16, zero %d, bucket_mb %g, delayed %d, %d ranks", stage, mb,
                                        delayed, nranks()), tol);
      }
  }
}

TEST(MpiZero, DelayedUpdateMatchesSerialStaleGradients) {
  // A different algorithm from the plain update (checked to differ), and exactly the serial one-step-stale one.
  for (int accum : {1, 2}) {
    OptimConfig ref = optim_config(0, 0, 1.0);
    ref.delayed_update = true;
    Trajectory want = run_serial(ref, accum, 4);
    Trajectory plain = run_serial(optim_config(0, 0, 1.0), accum, 4);
    double differ = 0;
    for (size_t i = 0; i < want.params.size(); i++)
      differ = std::max(differ, std::abs(static_cast<double>(want.params[i]) - plain.params[i]));
    EXPECT_GT(differ, 1e-4) << "the stale-gradient reference should not be the plain update";
    for (int stage : {0, 1, 2})
      for (bool deferred : {false, true}) {
        OptimConfig oc = optim_config(stage, 0.001, 1.0);
        oc.delayed_update = true;
        Trajectory got = run_zero(oc, accum, 4, {deferred, DType::F32, deferred});
        expect_same_run(got, want, strf("delayed, zero %d, deferred %d, accum %d, %d ranks", stage, deferred, accum,
                                        nranks()));
      }
  }
}

TEST(MpiZero, OptimizerBytesShrinkWithWorld) {
  ParamLayout layout(tiny_config());
  const size_t n = layout.total();
  QuadraticBackend be(tiny_config());
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(n);
  size_t bytes[3];
  for (int stage : {0, 1, 2}) {
    size_t before = mem_bytes(Mem::Optimizer);
    ZeroOptimizer opt(optim_config(stage, 0.001, 1.0), be, be.layout(), *comm, init.data());
    bytes[stage] = mem_bytes(Mem::Optimizer) - before;
    const Shard mine = zero_shard(n, nranks(), rank(), ZeroStage(stage));
    EXPECT_EQ(zero_shard_elements(layout, {}, nranks(), rank(), ZeroStage(stage)), mine.count);
    EXPECT_EQ(bytes[stage], zero_optimizer_bytes(mine.count)) << "zero " << stage;
    EXPECT_EQ(opt.shard_size(), mine.count);
    EXPECT_EQ(opt.shard_offset(), mine.offset);
    ASSERT_EQ(opt.shard_pieces().size(), 1u);
    EXPECT_EQ(opt.shard_pieces()[0].model_offset, mine.offset);
    // The shards tile the parameters: the next rank's starts where this one's ends.
    EXPECT_EQ(comm->sum(static_cast<double>(opt.shard_size())), stage == 0 ? n * nranks() : n) << "zero " << stage;
    if (stage > 0 && rank() + 1 < nranks() && mine.count > 0) {
      EXPECT_EQ(zero_shard(n, nranks(), rank() + 1, ZeroStage(stage)).offset, mine.offset + mine.count);
    }
  }
  EXPECT_EQ(bytes[0], 16 * n);  // master, m, v, gradient: 4 fp32 arrays
  EXPECT_EQ(comm->sum(static_cast<double>(bytes[1])), bytes[0]);
  EXPECT_EQ(bytes[2], bytes[1]);
  EXPECT_GE(zero_optimizer_bytes(zero_shard(n, nranks(), 0, ZeroStage(1)).count), bytes[1])
      << "rank 0's shard is the largest";
  OptimConfig delayed = optim_config(1, 0.001, 1.0);
  delayed.delayed_update = true;
  size_t before = mem_bytes(Mem::Optimizer);
  {
    ZeroOptimizer opt(delayed, be, be.layout(), *comm, init.data());
    EXPECT_EQ(mem_bytes(Mem::Optimizer) - before, zero_optimizer_bytes(opt.shard_size(), true));
  }
  EXPECT_EQ(zero_optimizer_bytes(zero_shard(n, nranks(), rank(), ZeroStage(1)).count, true),
            bytes[1] / 4 * 5);  // 2 gradients
}

TEST(MpiZero, StateAccessWaitsForDrain) {
  ParamLayout layout(tiny_config());
  QuadraticBackend be(tiny_config());
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(layout.total());
  OptimConfig oc = optim_config(1, 0.001, 1.0);
  oc.delayed_update = true;
  ZeroOptimizer opt(oc, be, be.layout(), *comm, init.data());
  std::vector<int32_t> tok = batch_tokens(0, rank(), 0);
  be.forward_backward(tok.data(), kRows, 1.0f / nranks(), opt.ready_hook());
  opt.after_micro_batch();
  end_step(opt, *comm, 1e-2);
  EXPECT_THROW(opt.master(), Error);  // the update is still in flight
  opt.drain();
  EXPECT_NE(opt.master(), nullptr);
  EXPECT_EQ(opt.adam_step(), 1);
}

// end_step: the norm is the world's (every rank reports the same), a non-finite loss skips the update and keeps
// the weights and the AdamW step, a finite one updates.
TEST(MpiZero, EndStepSkipsOnANonFiniteLoss) {
  ParamLayout layout(tiny_config());
  QuadraticBackend be(tiny_config());
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(layout.total());
  ZeroOptimizer opt(optim_config(1, 0.001, 1.0), be, be.layout(), *comm, init.data());
  std::vector<float> before(layout.total()), after(layout.total());
  for (int s = 0; s < 2; s++) {
    const std::vector<int32_t> tok = batch_tokens(s, rank(), 0);
    be.forward_backward(tok.data(), kRows, 1.0f / nranks(), opt.ready_hook());
    opt.after_micro_batch();
    be.get_params(before.data(), 0, before.size());
    const ZeroStepStats st = end_step(opt, *comm, 1e-2, s == 0 ? NAN : 1.0);
    be.get_params(after.data(), 0, after.size());
    EXPECT_EQ(st.skipped, s == 0) << "step " << s;
    EXPECT_EQ(opt.adam_step(), s) << "step " << s;
    EXPECT_EQ(before == after, s == 0) << "step " << s;
    EXPECT_GT(st.grad_norm, 0) << "step " << s;
    EXPECT_EQ(comm->sum(st.grad_norm), nranks() * st.grad_norm) << "step " << s;
  }
}

TEST(MpiZero, ShardsReassembleTheWeights) {
  // A checkpoint restore writes master() shard by shard; load_backend_params must rebuild every rank's weights.
  ParamLayout layout(tiny_config());
  const size_t n = layout.total();
  QuadraticBackend be(tiny_config());
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(n);
  for (int stage : {0, 1, 2}) {
    ZeroOptimizer opt(optim_config(stage, 0.001, 1.0), be, be.layout(), *comm, init.data());
    for (size_t i = 0; i < opt.shard_size(); i++) {
      size_t j = opt.shard_offset() + i;
      opt.master()[i] = static_cast<float>(j) + 0.5f;
    }
    opt.load_backend_params();
    std::vector<float> p(be.size());
    be.get_params(p.data(), 0, p.size());
    for (size_t j = 0; j < n; j++) ASSERT_EQ(p[j], static_cast<float>(j) + 0.5f) << "zero " << stage << " at " << j;
  }
}

TEST(MpiZero, MissingReadyModuleIsAnError) {
  ParamLayout layout(tiny_config());
  QuadraticBackend be(tiny_config());
  std::unique_ptr<Communicator> comm = world_communicator();
  std::vector<float> init = initial_params(layout.total());
  ZeroOptimizer opt(optim_config(1, 0.001, 1.0), be, be.layout(), *comm, init.data());
  for (int m = static_cast<int>(layout.modules().size()) - 1; m >= 1; m--) opt.ready_hook()(m);  // wte never
  EXPECT_THROW(opt.ready_hook()(1), Error);  // twice in one micro-batch
  EXPECT_THROW(opt.after_micro_batch(), Error);
}

}  // namespace
}  // namespace yuan
