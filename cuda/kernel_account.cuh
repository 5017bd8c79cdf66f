// The kernel account's hooks where GPU work is issued (backend/kernel_account.h, profile.kernels; kernel_account.cu):
//   OpScope       the op that the work enqueued by this thread in its lifetime belongs to: name, family, shape,
//                 FLOPs and ideal bytes (src/ops/op_cost.h). The innermost scope wins, so the function closest to
//                 the work opens it; work outside every scope is listed under family "other" by kernel name.
//   launch()      (launch.cuh) times every kernel; timed() does the same around a library call (a cuBLASLt GEMM,
//                 an NCCL call), and copy_async / copy_2d_async / fill_async are cudaMemcpyAsync,
//                 cudaMemcpy2DAsync and cudaMemsetAsync, each its own op.
//   push_phase    the backend's named ranges (range_push: forward, backward, optimizer, data, eval): the innermost
//                 is the phase of the ops begun under it; copies to and from the host and collectives are phase
//                 "transfer" wherever they run.
// When no account is active, a launch costs one null check and nothing is recorded: runs without profile.kernels
// compute what they computed before, bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <memory>

#include "backend/kernel_account.h"
#include "ops/op_cost.h"

namespace yuan::gpu {

// A printf format of up to four integers ("N=%lld C=%lld"), formatted only when the account reads its step.
struct OpShape {
  const char* format = "";
  long long v[4] = {};
};

struct OpInfo {
  const char* name = "";
  const char* family = "";
  OpShape shape;
  ops::OpCost cost;
  Roof roof = Roof::Device;  // Link, Host: the bytes cross a link (NCCL, host copies), phase "transfer"
  const char* exempt = nullptr;  // why the op cannot move only its ideal bytes (a constant beside its kernel)
};

class OpScope {
 public:
  explicit OpScope(const OpInfo& info);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  const OpInfo info;
  OpScope* const outer;  // the scope this one is inside, on this thread
  // The op's entry in the active account's step, made at its first timed work; `step` says which step it is of.
  uint64_t step = 0;
  int index = -1;
};

// One timed piece of work: a kernel, or a library call named by `label`; its events come from the account's pool.
struct LaunchRecord {
  const void* kernel = nullptr;
  const char* label = nullptr;
  int op = -1;         // in the step's ops
  uint64_t step = 0;   // the account's step it was begun in
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  bool ended = false;
#ifdef YUAN_EMU
  emu::Traffic traffic;  // filled by the emulator once the kernel has run
#endif
};

// The account's side of each piece of work: begin before it is enqueued (records its start event on `s`; null
// when the step's pool is spent), end after (records its end event).
class Account {
 public:
  virtual LaunchRecord* begin(const void* kernel, const char* label, cudaStream_t s) = 0;
  virtual void end(LaunchRecord* r, cudaStream_t s) = 0;

 protected:
  ~Account() = default;
};

// The account while a profiled step runs; null otherwise.
extern std::atomic<Account*> g_active_account;
inline Account* active_account() { return g_active_account.load(std::memory_order_acquire); }

// `issue()` (a library call enqueued on `s`) timed as `label` when an account is active.
template <typename Issue>
void timed(const char* label, cudaStream_t s, Issue&& issue) {
  Account* a = active_account();
  LaunchRecord* r = a ? a->begin(nullptr, label, s) : nullptr;
  issue();
  if (r) a->end(r, s);
}

void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
void copy_2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind, cudaStream_t s);
void fill_async(void* p, int value, size_t bytes, cudaStream_t s);

// The backend's named ranges, kept per thread whether an account is active or not.
void push_phase(const char* name);
void pop_phase();

// The account of the work of profiled steps on this process's device, whose compute stream (the step's begin and
// end events) is `compute`.
std::unique_ptr<KernelAccount> make_kernel_account(cudaStream_t compute);

// The device's rooflines: its dense bf16 peak (cuda_peak_flops), its memory bandwidth, NVLink's and the host
// link's rates, from the parts the project's machine files describe (input/machines), else the bandwidth from the
// memory clock and bus width and no link rates.
AccountPeak cuda_account_peak();

}  // namespace yuan::gpu
