// Kernel launches. A launch is checked as CUDA checks it, then enqueued on its stream; when the stream runs it,
// its blocks run one after another on the calling OS thread, and the threads of a block are fibers
// (Boost.Context's fcontext: a stack each and a register switch, no system call). A thread runs until it waits,
// at __syncthreads or in a warp collective, or ends, or until the schedule switches it out at an access of memory;
// the scheduler then resumes the next thread that can run. A barrier opens when every thread of the block waits at
// it; a warp collective completes when every lane of its mask has arrived, and the last to arrive computes it for
// all (warp.cpp). The schedule (Schedule, cuda_emu.h) orders the blocks and the threads forward, in reverse or
// shuffled, launch by launch, so that a result that depends on the order shows as a different result; the race
// checks (checks.cpp) look at every pair of accesses that nothing orders, so that no one order hides a race.
//
// A failed check ends the launch where it happened, like a faulting kernel: the thread's fiber is abandoned (never
// unwound: no frames to run), no further thread or block runs, and the error stays until take_reports().
#include <boost/context/detail/fcontext.hpp>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "emulator.h"

// The running launch's blockDim and gridDim (cuda_runtime.h); read by its threads only.
dim3 blockDim, gridDim;

namespace yuan::emu {
namespace {

namespace fc = boost::context::detail;

constexpr int kMaxThreads = 1024;  // a block's most on every target (target.cpp): a fiber stack each
constexpr size_t kStackBytes = 256 << 10, kGuardBytes = 4096;  // per thread; the guard page catches overflows
constexpr size_t kParamsMax = 32764;                                      // CUDA 12.1 and later, sm_70+
// With switches on, a thread stops after a random 1 to 2 kSwitchEvery - 1 memory accesses (kSwitchEvery on average).
constexpr uint64_t kSwitchEvery = 32;

struct Lane {
  ThreadSite site{};
  uint3 idx{};
  fc::fcontext_t self = nullptr;   // this thread, suspended
  fc::fcontext_t sched = nullptr;  // the scheduler, to return to
  enum State { Runnable, AtBarrier, InWarpOp, Done } state = Runnable;
  const char* file = nullptr;  // the barrier or collective it waits at
  int line = 0;
  LaneCall call{};
};

struct Warp {
  uint32_t count = 0;                              // collectives completed
  std::vector<std::pair<uint32_t, unsigned>> log;  // (count after it, mask) of those since the last barrier
  unsigned present = 0;                            // lanes this block has in the warp
  unsigned waiting = 0;                            // lanes waiting in a collective
  unsigned exited = 0;
};

struct Kernel {
  Launch cfg;
  std::shared_ptr<const void> params;
  size_t params_bytes;
  void (*entry)(const void*);
  std::string name;
};

struct Block {
  const Kernel* kernel = nullptr;
  uint3 idx{};
  unsigned char* dynamic = nullptr;
  std::vector<Lane> lanes;
  std::vector<Warp> warps;
  int done = 0, at_barrier = 0;
  bool aborted = false;
};

thread_local Block* t_block = nullptr;
thread_local Lane* t_lane = nullptr;

// The running launch's order and random numbers (splitmix64: small, and the same sequence on every machine).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = state += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};
thread_local Rng t_rng{0};
thread_local Order t_order = Order::Forward;
thread_local bool t_switches = false;
thread_local uint64_t t_until_switch = 0;  // accesses before the running thread stops

// Launches CUDA accepted, by kernel (kernel_launches).
std::map<const void*, uint64_t>& launch_counts() {
  static std::map<const void*, uint64_t> counts;
  return counts;
}

// cuda/'s kernels: "yuan::gpu::...::name_kernel" or "...name_kernel<args>" (a template's instantiation).
bool conventional_kernel(const std::string& name) {
  if (name.compare(0, 11, "yuan::gpu::") != 0) return false;
  const std::string base = name.back() == '>' ? name.substr(0, name.find('<')) : name;
  const std::string suffix = "_kernel";
  return base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Schedule& the_schedule() {
  static Schedule s = [] {
    Schedule d;
    if (const char* seed = std::getenv("YUAN_EMU_SEED")) d.seed = std::strtoull(seed, nullptr, 0);
    return d;
  }();
  return s;
}

// 0, 1, ..., n-1 in the running launch's order.
std::vector<uint32_t> in_order(size_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  if (t_order == Order::Reverse) std::reverse(v.begin(), v.end());
  if (t_order == Order::Shuffled)
    for (size_t i = n; i > 1; i--) std::swap(v[i - 1], v[t_rng.next() % i]);
  return v;
}

std::map<const void*, int>& shared_opt_in() {  // cudaFuncSetAttribute(MaxDynamicSharedMemorySize) per kernel
  static auto* m = new std::map<const void*, int>;
  return *m;
}

char* stacks() {
  static char* base = [] {
    const size_t slot = kStackBytes + kGuardBytes;
    void* p = mmap(nullptr, slot * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) std::abort();
    for (int i = 0; i < kMaxThreads; i++) mprotect(static_cast<char*>(p) + i * slot, kGuardBytes, PROT_NONE);
    return static_cast<char*>(p);
  }();
  return base;
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::ShflIdx: return "__shfl_sync";
    case WarpOp::ShflUp: return "__shfl_up_sync";
    case WarpOp::ShflDown: return "__shfl_down_sync";
    case WarpOp::ShflXor: return "__shfl_xor_sync";
    case WarpOp::Ballot: return "__ballot_sync";
    case WarpOp::All: return "__all_sync";
    case WarpOp::Any: return "__any_sync";
    case WarpOp::SyncWarp: return "__syncwarp";
    case WarpOp::Mma: return "mma.sync";
    case WarpOp::Ldmatrix: return "ldmatrix";
  }
  return "?";
}

Where where_of(const Block& b, const Lane& l) { return Where{b.kernel->name, b.idx, l.idx}; }

// The running thread, for a report; ldmatrix's checks run as the lane that gave the address (t_running).
Where here() { return Where{t_block->kernel->name, t_block->idx, thread_index(t_running->tid)}; }

std::string site_of(const Lane& l) {
  return l.file ? format("%s:%d", l.file, l.line) : std::string("(no source line)");
}

std::string waits_in(const Lane& l) {
  if (l.state == Lane::AtBarrier) return "waits at the __syncthreads at " + site_of(l);
  if (l.state == Lane::InWarpOp)
    return format("waits in %s (mask 0x%08x) at %s", op_name(l.call.op), l.call.mask, site_of(l).c_str());
  return l.state == Lane::Done ? "has exited" : "is running";
}

std::string thread_of(const Lane& l) { return format("thread (%u,%u,%u)", l.idx.x, l.idx.y, l.idx.z); }

void yield(Lane* l) {
  const fc::transfer_t t = fc::jump_fcontext(l->sched, nullptr);
  l->sched = t.fctx;
}

Lane* current(const char* what) {
  if (!t_lane) {
    std::fprintf(stderr, "cuda emulator: %s called outside a kernel\n", what);
    std::abort();
  }
  return t_lane;
}

// Every live thread waits at a barrier: it opens, unless a thread exited first or they wait at different ones.
bool try_open_barrier(Block& b) {
  const int live = static_cast<int>(b.lanes.size()) - b.done;
  if (b.at_barrier == 0 || b.at_barrier < live) return false;
  const Lane* first = nullptr;
  for (const Lane& l : b.lanes)
    if (l.state == Lane::AtBarrier && !first) first = &l;
  for (const Lane& l : b.lanes) {
    if (l.state == Lane::Done)
      kernel_fault(Check::BarrierDivergence, 0,
                   format("%s exited without reaching the __syncthreads at %s, where the block's other %d threads wait",
                          thread_of(l).c_str(), site_of(*first).c_str(), live));
    if (l.file != first->file || l.line != first->line)
      kernel_fault(Check::BarrierDivergence, 0,
                   format("%s waits at the __syncthreads at %s, %s at the one at %s", thread_of(*first).c_str(),
                          site_of(*first).c_str(), thread_of(l).c_str(), site_of(l).c_str()));
  }
  for (Lane& l : b.lanes) l.state = Lane::Runnable;
  b.at_barrier = 0;
  barrier_shared();
  for (Warp& w : b.warps) w.log.clear();
  return true;
}

// `me` has arrived in a collective: completes it when every lane of its mask has.
bool try_complete(Block& b, Lane* me) {
  const unsigned mask = me->call.mask;
  const int base = me->site.warp * 32;
  Warp& w = b.warps[me->site.warp];
  if ((w.waiting & mask) != mask) return false;
  LaneCall* calls[32] = {};
  for (int j = 0; j < 32; j++) {
    if (!(mask >> j & 1)) continue;
    Lane& o = b.lanes[base + j];
    if (o.call.op != me->call.op || o.call.mask != mask)
      kernel_fault(Check::WarpDivergence, 0,
                   format("lane %d %s, lane %d %s: the lanes of a mask must call the same collective with the same "
                          "mask",
                          me->site.lane, waits_in(*me).c_str(), j, waits_in(o).c_str()));
    calls[j] = &o.call;
  }
  complete_warp_op(calls, mask, [&](const void* row, int lane) {
    check_shared(reinterpret_cast<uintptr_t>(row), 16, false, base + lane, calls[lane]->pc);
  });
  w.count++;
  w.log.emplace_back(w.count, mask);
  w.waiting &= ~mask;
  for (int j = 0; j < 32; j++)
    if (mask >> j & 1) b.lanes[base + j].state = Lane::Runnable;
  return true;
}

// The calling thread enters a warp collective and returns when it is complete, with its results in `call.out`.
void collective(LaneCall& call) {
  Lane* me = current(op_name(call.op));
  Block& b = *t_block;
  const Warp& w = b.warps[me->site.warp];
  if (!(call.mask >> me->site.lane & 1))
    kernel_fault(Check::WarpDivergence, 0,
                 format("%s at %s with mask 0x%08x, which leaves out the calling lane %d", op_name(call.op),
                        call.file ? format("%s:%d", call.file, call.line).c_str() : "?", call.mask, me->site.lane));
  if (call.mask & ~w.present)
    kernel_fault(Check::WarpDivergence, 0,
                 format("%s with mask 0x%08x names lanes this warp does not have (lanes 0x%08x)", op_name(call.op),
                        call.mask, w.present));
  if (call.mask & w.exited)
    kernel_fault(Check::WarpDivergence, 0,
                 format("%s (mask 0x%08x) at %s names lane %d, which has exited", op_name(call.op), call.mask,
                        call.file ? format("%s:%d", call.file, call.line).c_str() : "?",
                        __builtin_ctz(call.mask & w.exited)));
  me->call = call;
  me->file = call.file;
  me->line = call.line;
  me->state = Lane::InWarpOp;
  b.warps[me->site.warp].waiting |= 1u << me->site.lane;
  if (!try_complete(b, me)) yield(me);
  call = me->call;
}

void finish(Lane* l) {
  Block& b = *t_block;
  l->state = Lane::Done;
  b.done++;
  b.warps[l->site.warp].exited |= 1u << l->site.lane;
  const int base = l->site.warp * 32;
  for (int j = 0; j < 32 && base + j < static_cast<int>(b.lanes.size()); j++) {
    const Lane& o = b.lanes[base + j];
    if (o.state == Lane::InWarpOp && (o.call.mask >> l->site.lane & 1))
      kernel_fault(Check::WarpDivergence, 0,
                   format("exited while lane %d %s", j, waits_in(o).c_str()));
  }
  try_open_barrier(b);
}

void lane_main(fc::transfer_t t) {
  Lane* l = static_cast<Lane*>(t.data);
  l->sched = t.fctx;
  const Kernel& k = *t_block->kernel;
  k.entry(k.params.get());
  finish(l);
  fc::jump_fcontext(l->sched, nullptr);  // never resumed
}

// Nobody can run and the block is not done: name a waiting thread and what it waits for.
void diagnose(Block& b) {
  for (const Lane& l : b.lanes) {
    if (l.state != Lane::InWarpOp) continue;
    for (int j = 0; j < 32; j++) {
      const Lane& o = b.lanes[l.site.warp * 32 + j];
      if ((l.call.mask >> j & 1) && o.state != Lane::InWarpOp) {
        report(Check::WarpDivergence, where_of(b, l), 0,
               format("lane %d %s for lane %d, which %s", l.site.lane, waits_in(l).c_str(), j, waits_in(o).c_str()),
               true, cudaErrorLaunchFailure);
        return;
      }
    }
  }
  for (const Lane& l : b.lanes)
    if (l.state == Lane::AtBarrier) {
      report(Check::BarrierDivergence, where_of(b, l), 0, thread_of(l) + " " + waits_in(l) + ", which the block's "
             "other threads never reach", true, cudaErrorLaunchFailure);
      return;
    }
}

void run_block(const Kernel& k, uint3 idx, Block& b) {
  const dim3 bd = k.cfg.block;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  b.kernel = &k;
  b.idx = idx;
  b.lanes.assign(n, Lane{});
  b.warps.assign((n + 31) / 32, Warp{});
  b.done = b.at_barrier = 0;
  b.aborted = false;
  b.dynamic = begin_block_shared(k.cfg.shared_bytes, idx);
  char* const base = stacks();
  for (int i = 0; i < n; i++) {
    Lane& l = b.lanes[i];
    l.site = ThreadSite{i, i / 32, i % 32};
    l.idx = uint3{i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
    char* top = base + (i + 1) * (kStackBytes + kGuardBytes);
    l.self = fc::make_fcontext(top, kStackBytes, lane_main);
    b.warps[i / 32].present |= 1u << (i % 32);
  }
  t_block = &b;
  const std::vector<uint32_t> order = in_order(n);
  while (b.done < n && !b.aborted) {
    bool progress = false;
    for (uint32_t i : order) {
      Lane& l = b.lanes[i];
      if (l.state != Lane::Runnable) continue;
      progress = true;
      t_lane = &l;
      t_running = &l.site;
      l.self = fc::jump_fcontext(l.self, &l).fctx;
      t_lane = nullptr;
      t_running = nullptr;
      if (b.aborted) break;
    }
    if (!progress && !b.aborted) {
      diagnose(b);
      b.aborted = true;
    }
  }
  if (counter) end_block_traffic(*counter);
  t_block = nullptr;
}

// A kernel thread that faults (a wild pointer outside the arenas, a stack overflow) says which one it was.
struct sigaction g_previous_segv;
void on_segv(int sig, siginfo_t* info, void* ctx) {
  if (t_lane && t_block)
    std::fprintf(stderr,
                 "========= cuda emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u) crashed: signal %d at address "
                 "%p (a wild pointer, or a thread stack of %zu KiB overflowed)\n",
                 t_block->kernel->name.c_str(), t_block->idx.x, t_block->idx.y, t_block->idx.z, t_lane->idx.x,
                 t_lane->idx.y, t_lane->idx.z, sig, info->si_addr, kStackBytes >> 10);
  sigaction(sig, &g_previous_segv, nullptr);
  if (g_previous_segv.sa_flags & SA_SIGINFO && g_previous_segv.sa_sigaction)
    g_previous_segv.sa_sigaction(sig, info, ctx);
  else
    raise(sig);
}

void install_crash_report() {
  static const bool installed = [] {
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    return true;
  }();
  (void)installed;
  thread_local const bool alt_stack = [] {  // the handler needs a stack when a fiber's has overflowed
    stack_t st = {};
    st.ss_size = 1 << 16;
    st.ss_sp = std::malloc(st.ss_size);
    sigaltstack(&st, nullptr);
    return true;
  }();
  (void)alt_stack;
}

const char* order_name(Order o) {
  return o == Order::Forward ? "forward" : o == Order::Reverse ? "in reverse" : "shuffled";
}

// Runs every block of the launch, in the running order; false when a check ended it.
bool run_grid(const Kernel& k, bool journal) {
  begin_launch(journal);
  Block b;
  const dim3 g = k.cfg.grid;
  ::gridDim = g;
  ::blockDim = k.cfg.block;
  for (uint32_t i : in_order(size_t(g.x) * g.y * g.z)) {
    run_block(k, uint3{i % g.x, i / g.x % g.y, i / g.x / g.y}, b);
    if (b.aborted) return false;
  }
  return true;
}

void run_kernel(const Kernel& k) {
  if (sticky_error() != cudaSuccess) return;
  install_crash_report();
  const uintptr_t params = reinterpret_cast<uintptr_t>(k.params.get());
  const uintptr_t stacks_begin = reinterpret_cast<uintptr_t>(stacks());
  set_host_windows(HostWindows{stacks_begin, stacks_begin + kMaxThreads * (kStackBytes + kGuardBytes), params,
                               params + k.params_bytes});
  static uint64_t launches = 0;  // under the emulator's lock
  const Schedule& sched = the_schedule();
  const uint64_t serial = launches++;
  const bool varied = sched.order == Order::Varied;
  t_order = varied ? static_cast<Order>(serial % 3) : sched.order;
  t_rng = Rng{sched.seed * 0x100000001b3ull ^ serial};
  t_switches = sched.switches;
  t_until_switch = 1;
  if (k.cfg.traffic) begin_traffic(k.cfg);
  const bool finished = run_grid(k, varied);
  if (k.cfg.traffic) end_traffic(k.cfg.traffic);  // the first run's: a second one repeats it in another order
  const Journal first = take_journal();
  if (!finished || !varied || !launch_used_atomics() || !first.complete) return;
  // Atomics are the one way a race-free kernel's result can depend on the order (which thread comes first, a sum
  // in arrival order): the launch runs again from the same memory, in another order, and must write the same.
  std::vector<uint8_t> after(first.at.size());
  std::unordered_set<uintptr_t> written(first.at.begin(), first.at.end());
  for (size_t i = 0; i < after.size(); i++) after[i] = *reinterpret_cast<const uint8_t*>(first.at[i]);
  undo(first);
  const Order was = t_order;
  t_order = was == Order::Forward ? Order::Reverse : Order::Forward;
  if (!run_grid(k, true)) return;
  const Journal second = take_journal();
  auto differs = [&](uintptr_t a, uint8_t expected) {
    const uint8_t now = *reinterpret_cast<const uint8_t*>(a);
    if (now == expected) return false;
    report(Check::OrderDependence, Where{k.name, {}, {}}, a,
           format("device byte 0x%zx holds 0x%02x when the blocks and threads run %s, 0x%02x when they run %s", a,
                  expected, order_name(was), now, order_name(t_order)),
           true, cudaErrorLaunchFailure);
    return true;
  };
  for (size_t i = 0; i < after.size(); i++)
    if (differs(first.at[i], after[i])) return;
  for (size_t i = 0; i < second.at.size(); i++)  // bytes only the second run wrote held their old value after the first
    if (!written.count(second.at[i]) && differs(second.at[i], second.before[i])) return;
}

}  // namespace

// ---- launches ----

cudaError_t launch(const Launch& l, std::shared_ptr<const void> params, size_t params_bytes,
                   void (*entry)(const void*)) {
  Lock lock(mutex());
  if (sticky_error() != cudaSuccess) return last_error() = sticky_error();
  auto k = std::make_shared<Kernel>(Kernel{l, std::move(params), params_bytes, entry, function_name(l.kernel)});
  auto refuse = [&](cudaError_t e, const std::string& why) {
    report(Check::Launch, Where{k->name, {}, {}}, 0, why, false, e);
    return last_error() = e;
  };
  const Target& d = target();
  const dim3 b = l.block, g = l.grid;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      threads > static_cast<unsigned>(d.threads_per_block))
    return refuse(cudaErrorInvalidConfiguration, format("block (%u,%u,%u): at most (1024,1024,64) and %d threads", b.x,
                                                        b.y, b.z, d.threads_per_block));
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    return refuse(cudaErrorInvalidConfiguration,
                  format("grid (%u,%u,%u): at most (2^31-1,65535,65535)", g.x, g.y, g.z));
  // What the compiled kernel states. Where there is a table, one of cuda/'s kernels missing from it (a table older
  // than the source) is refused as a GPU refuses a kernel its binary lacks, rather than run unchecked; the tests'
  // own kernels are not compiled into it.
  bool table = false;
  const Compiled* c = compiled(l.kernel, &table);
  if (!c && table && conventional_kernel(k->name))
    return refuse(cudaErrorInvalidDeviceFunction,
                  "the kernel is not in the ptxas table, so its compiled limits are unknown (make emu rebuilds it)");
  const size_t static_shared = c ? c->static_shared : 0;
  const auto opt = shared_opt_in().find(l.kernel);
  const size_t limit = opt != shared_opt_in().end() ? static_cast<size_t>(opt->second)
                                                    : d.shared_per_block - std::min(static_shared, d.shared_per_block);
  if (l.shared_bytes > limit)
    return refuse(cudaErrorInvalidValue,
                  format("%zu bytes of dynamic shared memory, above the kernel's %zu (%zu KiB with its %zu static "
                         "bytes; above that a kernel must opt in with "
                         "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))",
                         l.shared_bytes, limit, d.shared_per_block >> 10, static_shared));
  if (c && c->max_threads > 0 && threads > static_cast<unsigned>(c->max_threads))
    return refuse(cudaErrorInvalidValue, format("block (%u,%u,%u): %llu threads, above the %d of the kernel's "
                                                "__launch_bounds__ (the maximum its cubin states)",
                                                b.x, b.y, b.z, threads, c->max_threads));
  if (c && c->registers > 0) {
    // Registers are allocated per warp, rounded up to the allocation unit (the occupancy calculator's rule).
    const unsigned long long warps = (threads + d.warp_size - 1) / d.warp_size;
    const unsigned long long per_warp =
        (1ull * c->registers * d.warp_size + d.register_unit - 1) / d.register_unit * d.register_unit;
    if (warps * per_warp > static_cast<unsigned long long>(d.registers_per_block))
      return refuse(cudaErrorLaunchOutOfResources,
                    format("block (%u,%u,%u): %llu warps of %llu registers (%d a thread, as ptxas compiled it) are "
                           "%llu, above the %d a block may hold on the %s",
                           b.x, b.y, b.z, warps, per_warp, c->registers, warps * per_warp, d.registers_per_block,
                           d.description));
  }
  if (params_bytes > kParamsMax)
    return refuse(cudaErrorInvalidValue, format("%zu bytes of parameters, above %zu", params_bytes, kParamsMax));
  if (!valid_stream(l.stream))
    return refuse(cudaErrorInvalidResourceHandle, format("stream %p is not a live stream", (void*)l.stream));
  launch_counts()[l.kernel]++;
  enqueue(l.stream, [k](bool) {
    run_kernel(*k);
    return true;
  }, l.kernel);
  return cudaSuccess;
}

std::vector<KernelLaunches> kernel_launches() {
  Lock lock(mutex());
  std::map<const void*, KernelLaunches> all;
  for (const void* f : functions_containing("_kernel")) {
    const std::string name = function_name(f);
    if (conventional_kernel(name)) all[f] = {name, 0, true};
  }
  for (const auto& [f, n] : launch_counts()) {
    KernelLaunches& k = all[f];
    if (k.name.empty()) k = {function_name(f), 0, false};
    k.launches = n;
  }
  std::vector<KernelLaunches> out;
  for (auto& [f, k] : all) out.push_back(std::move(k));
  std::sort(out.begin(), out.end(), [](const KernelLaunches& a, const KernelLaunches& b) { return a.name < b.name; });
  return out;
}

cudaError_t set_shared_opt_in(const void* kernel, int bytes, std::string* why) {
  // The dynamic shared memory a kernel may opt in to is what its static shared memory leaves of the target's most.
  const Target& d = target();
  bool table = false;
  const Compiled* c = compiled(kernel, &table);
  const size_t most = d.shared_per_block_optin - (c ? std::min(c->static_shared, d.shared_per_block_optin) : 0);
  if (bytes < 0 || static_cast<size_t>(bytes) > most) {
    *why = format("%d bytes of dynamic shared memory, above the %zu the %s allows the kernel (%zu KiB a block, less "
                  "its static shared memory)",
                  bytes, most, d.description, d.shared_per_block_optin >> 10);
    return cudaErrorInvalidValue;
  }
  shared_opt_in()[kernel] = bytes;
  return cudaSuccess;
}

void set_schedule(const Schedule& s) {
  Lock lock(mutex());
  the_schedule() = s;
}

Schedule schedule() {
  Lock lock(mutex());
  return the_schedule();
}

// ---- what kernel threads ask ----

uint3 thread_idx() { return current("threadIdx")->idx; }
uint3 block_idx() {
  current("blockIdx");
  return t_block->idx;
}
unsigned char* dynamic_shared() {
  current("dynamic shared memory");
  return t_block->dynamic;
}

void sync_threads(const char* file, int line) {
  Lane* me = current("__syncthreads");
  Block& b = *t_block;
  me->state = Lane::AtBarrier;
  me->file = file;
  me->line = line;
  b.at_barrier++;
  if (!try_open_barrier(b)) yield(me);
}

uint64_t shuffle(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  LaneCall c{};
  c.op = op, c.mask = mask, c.value = value, c.arg = arg, c.width = width, c.file = file, c.line = line;
  collective(c);
  return c.out[0] | static_cast<uint64_t>(c.out[1]) << 32;
}

unsigned vote(WarpOp op, unsigned mask, bool pred, const char* file, int line) {
  LaneCall c{};
  c.op = op, c.mask = mask, c.value = pred, c.file = file, c.line = line;
  collective(c);
  return c.out[0];
}

void sync_warp(unsigned mask, const char* file, int line) {
  LaneCall c{};
  c.op = WarpOp::SyncWarp, c.mask = mask, c.file = file, c.line = line;
  collective(c);
}

// mma.sync and ldmatrix are .aligned: the whole warp takes part, which a partial last warp cannot.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  LaneCall call{};
  call.op = WarpOp::Mma, call.mask = ~0u;
  std::memcpy(call.in, a, 16);
  std::memcpy(call.in + 4, b, 8);
  std::memcpy(call.in + 6, c, 16);
  collective(call);
  std::memcpy(d, call.out, 16);
}

void ldmatrix(uint32_t* r, int matrices, bool trans, const void* row) {
  LaneCall call{};
  call.op = WarpOp::Ldmatrix, call.mask = ~0u, call.addr = row, call.matrices = matrices, call.trans = trans;
  call.pc = __builtin_return_address(0);
  collective(call);
  std::memcpy(r, call.out, 4 * matrices);
}

// ---- for the checks and reports ----

void kernel_fault(Check c, uintptr_t address, const std::string& what) {
  Block& b = *t_block;
  report(c, here(), address, what, true,
         c == Check::Misaligned                                                           ? cudaErrorMisalignedAddress
         : c == Check::OutOfBounds || c == Check::UseAfterFree || c == Check::HostMemory ? cudaErrorIllegalAddress
                                                                                          : cudaErrorLaunchFailure);
  b.aborted = true;
  fc::jump_fcontext(t_lane->sched, nullptr);  // the scheduler sees `aborted` and never resumes this thread
  __builtin_unreachable();
}

uint3 thread_index(int tid) {
  const dim3 bd = t_block->kernel->cfg.block;
  return uint3{tid % bd.x, (tid / bd.x) % bd.y, tid / (bd.x * bd.y)};
}

uint32_t warp_sync_count(int warp) { return t_block->warps[warp].count; }

void maybe_switch() {
  if (!t_switches || !t_lane || --t_until_switch > 0) return;
  t_until_switch = 1 + t_rng.next() % (2 * kSwitchEvery - 1);
  yield(t_lane);
}

bool warp_synced(int warp, uint32_t seq, unsigned lanes) {
  for (const auto& [count, mask] : t_block->warps[warp].log)
    if (count > seq && (mask & lanes) == lanes) return true;
  return false;
}

}  // namespace yuan::emu
