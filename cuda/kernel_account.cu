// The kernel account (kernel_account.cuh, backend/kernel_account.h) on CUDA events.
//
// Each timed piece of work takes a start and an end event, recorded on the stream it runs on, from a pool made
// with the account (before the first profiled step). Inside a profiled step nothing is created or allocated: the
// pool's records and the step's op entries are reserved beforehand; work beyond the pool is counted as untimed,
// and the pool grows before the next step to what the short one needed. At the step's end the account waits for
// its step-end event and each stream's last end event, reads every event's time against the step-begin event,
// and folds the step into operations by (name, phase, shape). The union of the work's intervals over all streams
// is the step's busy time; the rest of the step (launch gaps, host waits, idle) is unaccounted.
#include "kernel_account.cuh"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "device.cuh"
#include "util/log.h"

namespace yuan::gpu {

std::atomic<Account*> g_active_account{nullptr};

namespace {

thread_local OpScope* t_scope = nullptr;
thread_local std::vector<std::string> t_phases;

constexpr size_t kInitialRecords = 16384;  // a gpt-xl step of 8 micro-batches issues about that many

// The demangled name without its parameter list, the return type a template instance's name carries, or the
// anonymous namespace's qualifier: "yuan::gpu::layernorm_forward_kernel<8>".
std::string kernel_name(const void* kernel) {
  const char* raw = nullptr;
#if defined(YUAN_EMU) || CUDART_VERSION >= 12030
  if (cudaFuncGetName(&raw, kernel) != cudaSuccess) raw = nullptr;
#endif
  if (!raw) return "kernel (name unknown before CUDA 12.3)";
  int status = 0;
  char* d = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : raw;
  std::free(d);
  const std::string anon = "(anonymous namespace)::";
  for (size_t at; (at = s.find(anon)) != std::string::npos;) s.erase(at, anon.size());
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') depth++;
      if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  return s;
}

std::string shape_text(const OpShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, s.format, s.v[0], s.v[1], s.v[2], s.v[3]);
  return buf;
}

const char* copy_label(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToDevice: return "memcpy HtoD";
    case cudaMemcpyDeviceToHost: return "memcpy DtoH";
    case cudaMemcpyDeviceToDevice: return "memcpy DtoD";
    default: return "memcpy";
  }
}

// A copy's op: device to device moves its bytes through HBM twice (read, write), any other the host link once.
OpInfo copy_op(cudaMemcpyKind kind, size_t bytes) {
  const bool on_device = kind == cudaMemcpyDeviceToDevice;
  return {copy_label(kind), "copy", {"bytes=%lld", {static_cast<long long>(bytes)}},
          on_device ? ops::copy_cost(static_cast<double>(bytes), 1, 1) : ops::transfer_cost(static_cast<double>(bytes)),
          on_device ? Roof::Device : Roof::Host};
}

class CudaKernelAccount final : public KernelAccount, public Account {
 public:
  explicit CudaKernelAccount(cudaStream_t compute) : compute_(compute) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    device_ = prop.name;
    peak_ = cuda_account_peak();
    CUDA_CHECK(cudaEventCreate(&step_begin_));
    CUDA_CHECK(cudaEventCreate(&step_end_));
    grow(kInitialRecords);
  }

  ~CudaKernelAccount() override {
    Account* self = this;
    g_active_account.compare_exchange_strong(self, nullptr);
    // Destructors do not throw: errors are ignored. Work still queued may record into the events.
    cudaDeviceSynchronize();
    for (const LaunchRecord& r : records_) {
      cudaEventDestroy(r.start);
      cudaEventDestroy(r.end);
    }
    cudaEventDestroy(step_begin_);
    cudaEventDestroy(step_end_);
  }

  void begin_step() override {
    if (untimed_step_ > 0) grow(records_.size() + untimed_step_);
    untimed_step_ = 0;
    used_ = 0;
    ops_.clear();
    step_++;
    CUDA_CHECK(cudaEventRecord(step_begin_, compute_));
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = true;
    }
    g_active_account.store(this, std::memory_order_release);
  }

  void end_step() override {
    CUDA_CHECK(cudaEventRecord(step_end_, compute_));
    g_active_account.store(nullptr, std::memory_order_release);
    size_t used = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_ = false;
      used = used_;
    }
    // The step-end event, then each stream's last piece of work: every event of the step is complete after these.
    gpu::wait_event(step_end_, "the kernel account's step end");
    std::map<cudaStream_t, const LaunchRecord*> last;
    for (size_t i = 0; i < used; i++)
      if (records_[i].ended) last[records_[i].stream] = &records_[i];
    for (const auto& [stream, r] : last) gpu::wait_event(r->end, "the kernel account's last launch");
    harvest(used);
  }

  KernelReport report() const override {
    KernelReport r;
    r.device = device_;
#ifdef YUAN_EMU
    r.emulated = true;
#endif
    r.step_s = step_s_;
    r.busy_s = busy_s_;
    r.untimed = untimed_;
    r.peak = peak_;
    r.ops = ops_total_;
    std::stable_sort(r.ops.begin(), r.ops.end(),
                     [](const AccountedOp& a, const AccountedOp& b) { return a.time_s > b.time_s; });
    for (AccountedOp& op : r.ops)
      std::stable_sort(op.kernels.begin(), op.kernels.end(),
                       [](const KernelTime& a, const KernelTime& b) { return a.time_s > b.time_s; });
    return r;
  }

  LaunchRecord* begin(const void* kernel, const char* label, cudaStream_t s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_) return nullptr;
    if (used_ == records_.size()) {
      untimed_step_++;
      untimed_++;
      return nullptr;
    }
    LaunchRecord& r = records_[used_++];
    r.kernel = kernel;
    r.label = label;
    r.stream = s;
    r.step = step_;
    r.ended = false;
    r.op = op_of_this_thread();
#ifdef YUAN_EMU
    r.traffic = emu::Traffic{};
#endif
    CUDA_CHECK(cudaEventRecord(r.start, s));
    return &r;
  }

  // Work begun on another thread as the step ended stays out of it: its record may already be the next step's.
  void end(LaunchRecord* r, cudaStream_t s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_ || r->step != step_) return;
    CUDA_CHECK(cudaEventRecord(r->end, s));
    r->ended = true;
  }

 private:
  struct StepOp {
    OpInfo info;
    std::string phase;  // short names: kept in the string itself, no allocation
  };

  // The entry of this thread's innermost scope in the step's ops, made at its first timed work; work outside
  // every scope gets an entry of its own (family "other", named by its kernel at the harvest).
  int op_of_this_thread() {
    OpScope* sc = t_scope;
    if (sc && sc->step == step_ && sc->index >= 0) return sc->index;
    StepOp op;
    if (sc) op.info = sc->info;
    else op.info.family = "other";
    const bool transfer = op.info.roof != Roof::Device;
    op.phase = transfer ? "transfer" : t_phases.empty() ? "none" : t_phases.back();
    ops_.push_back(std::move(op));  // reserved: at most one op per record
    const int index = static_cast<int>(ops_.size()) - 1;
    if (sc) {
      sc->step = step_;
      sc->index = index;
    }
    return index;
  }

  // Between steps only: `n` records with their events, and room for as many ops.
  void grow(size_t n) {
    const size_t had = records_.size();
    records_.resize(n);
    for (size_t i = had; i < n; i++) {
      CUDA_CHECK(cudaEventCreate(&records_[i].start));
      CUDA_CHECK(cudaEventCreate(&records_[i].end));
    }
    ops_.reserve(n);
  }

  double since_begin(cudaEvent_t e) const {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, step_begin_, e));
    return ms * 1e-3;
  }

  const std::string& name_of(const void* kernel) {
    std::string& n = names_[kernel];
    if (n.empty()) n = kernel_name(kernel);
    return n;
  }

  void harvest(size_t used) {
    const double step = since_begin(step_end_);
    std::vector<std::pair<double, double>> spans;
    std::vector<bool> called(ops_.size(), false);
    for (size_t i = 0; i < used; i++) {
      const LaunchRecord& rec = records_[i];
      if (!rec.ended) continue;  // begun as the step ended, on another thread
      const double t0 = since_begin(rec.start), t1 = since_begin(rec.end);
      spans.emplace_back(std::clamp(t0, 0.0, step), std::clamp(t1, 0.0, step));
      const StepOp& sop = ops_[rec.op];
      const std::string kname = rec.label ? rec.label : name_of(rec.kernel);
      const bool other = sop.info.name[0] == '\0';
      const std::string shape = shape_text(sop.info.shape);
      const std::string& name = other ? kname : std::string(sop.info.name);
      auto key = std::make_tuple(name, sop.phase, shape);
      auto [it, fresh] = op_index_.try_emplace(key, ops_total_.size());
      if (fresh) {
        AccountedOp a;
        a.name = name;
        a.family = sop.info.family;
        a.phase = sop.phase;
        a.shape = shape;
        a.roof = sop.info.roof;
        if (sop.info.exempt) a.exempt = sop.info.exempt;
        ops_total_.push_back(std::move(a));
      }
      AccountedOp& op = ops_total_[it->second];
      if (!called[rec.op]) {  // the op's cost counts once per call, whatever its launches
        called[rec.op] = true;
        op.calls++;
        op.flops += sop.info.cost.flops;
        op.ideal_bytes += sop.info.cost.bytes;
      }
      op.launches++;
      op.time_s += t1 - t0;
      auto k = std::find_if(op.kernels.begin(), op.kernels.end(),
                            [&](const KernelTime& x) { return x.name == kname; });
      if (k == op.kernels.end()) {
        op.kernels.push_back(KernelTime{});
        k = op.kernels.end() - 1;
        k->name = kname;
      }
      k->launches++;
      k->time_s += t1 - t0;
#ifdef YUAN_EMU
      add_traffic(*k, rec.traffic);
#endif
    }
    step_s_ += step;
    busy_s_ += union_length(spans);
  }

#ifdef YUAN_EMU
  static void add_traffic(KernelTime& k, const emu::Traffic& t) {
    k.read_bytes += t.read_bytes;
    k.written_bytes += t.written_bytes;
    k.requests += t.requests;
    k.sectors += t.sectors;
    k.used_bytes += t.used_bytes;
    k.shared_requests += t.shared_requests;
    k.bank_conflicts += t.bank_conflicts;
    k.occupancy = t.occupancy;  // a kernel's, the same for its launches of one configuration
    k.registers = t.registers;
    for (const std::string& f : t.findings)
      if (k.findings.size() < 8 && std::find(k.findings.begin(), k.findings.end(), f) == k.findings.end())
        k.findings.push_back(f);
  }
#endif

  static double union_length(std::vector<std::pair<double, double>>& spans) {
    std::sort(spans.begin(), spans.end());
    double total = 0, begin = 0, end = -1;
    for (const auto& [a, b] : spans) {
      if (a > end) {
        if (end > begin) total += end - begin;
        begin = a;
        end = b;
      } else {
        end = std::max(end, b);
      }
    }
    if (end > begin) total += end - begin;
    return total;
  }

  cudaStream_t compute_;
  std::string device_;
  AccountPeak peak_;
  cudaEvent_t step_begin_ = nullptr, step_end_ = nullptr;
  std::mutex mu_;  // begin and end come from any thread that issues work (the optimizer's upload lanes)
  bool active_ = false;
  uint64_t step_ = 0;
  std::vector<LaunchRecord> records_;  // the pool; records_[0, used_) are this step's
  size_t used_ = 0;
  std::vector<StepOp> ops_;  // this step's op calls
  int64_t untimed_step_ = 0, untimed_ = 0;
  // Over the profiled steps.
  double step_s_ = 0, busy_s_ = 0;
  std::vector<AccountedOp> ops_total_;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> op_index_;
  std::map<const void*, std::string> names_;
};

}  // namespace

OpScope::OpScope(const OpInfo& i) : info(i), outer(t_scope) { t_scope = this; }
OpScope::~OpScope() { t_scope = outer; }

void push_phase(const char* name) { t_phases.emplace_back(name); }
void pop_phase() {
  if (!t_phases.empty()) t_phases.pop_back();
}

void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  const OpScope op(copy_op(kind, bytes));
  timed(op.info.name, s, [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s)); });
}

void copy_2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind, cudaStream_t s) {
  const OpScope op(copy_op(kind, width * height));
  timed(op.info.name, s,
        [&] { CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s)); });
}

void fill_async(void* p, int value, size_t bytes, cudaStream_t s) {
  const OpScope op({"memset", "copy", {"bytes=%lld", {static_cast<long long>(bytes)}},
                    ops::fill_cost(static_cast<double>(bytes))});
  timed("memset", s, [&] { CUDA_CHECK(cudaMemsetAsync(p, value, bytes, s)); });
}

std::unique_ptr<KernelAccount> make_kernel_account(cudaStream_t compute) {
  return std::make_unique<CudaKernelAccount>(compute);
}

}  // namespace yuan::gpu
