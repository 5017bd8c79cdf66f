// How the parts of the CUDA emulator talk to each other (docs/EMULATOR.md has the design):
//   memory.cpp   device and pinned memory: arenas, allocations, the initialisation shadow of device memory
//   checks.cpp   the instrumentation hooks every access of a .cu file calls; shared memory's race and init shadow
//   kernel.cpp   launches: blocks of fibers, barriers, warp collectives, the built-in variables
//   warp.cpp     what a completed warp collective computes (shuffles, votes, mma.sync, ldmatrix)
//   traffic.cpp  what a launch that asks does to memory (requests, sectors, bank conflicts) and its occupancy
//   target.cpp   the device it stands for (YUAN_EMU_TARGET) and the compiled kernels' resources (the ptxas table)
//   streams.cpp  streams and events: work runs when the host needs its result, in an order CUDA allows; the
//                vector clocks that say which operations CUDA orders, whenever they run
//   order.cpp    the happens-before check: each byte range's last writer and readers since, held to those clocks
//   report.cpp   reports, the sticky error, names of kernels and shared arrays (symbols.cpp reads them)
//   runtime.cpp, cublaslt.cpp, nccl.cpp: the library APIs on top of those
// Nothing here is thread-safe on its own: runtime entry points take the emulator's lock (Lock).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "cuda_runtime_api.h"

namespace yuan::emu {

// The emulator's one lock: every API entry point holds it, so that kernels, copies and library calls of
// several host threads do not interleave (kernels run on the thread that needs their result).
using Lock = std::lock_guard<std::recursive_mutex>;
std::recursive_mutex& mutex();

// ---- report.cpp ----

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Where a report happened: a kernel's thread, or host code (kernel empty).
struct Where {
  std::string kernel;
  uint3 block{}, thread{};
};
// Records and prints a report. `sticky`: CUDA calls fail with `error` from now on, as after a faulting kernel,
// until take_reports(); otherwise `error` is only what the failing call returns, and cudaGetErrorString(error)
// gives the report's message.
void report(Check c, const Where& where, uintptr_t address, const std::string& what, bool sticky, cudaError_t error);
cudaError_t sticky_error();
// The message of the latest report that returned `e`, for cudaGetErrorString; null when none.
const char* report_message(cudaError_t e);
// symbols.cpp: the demangled name of the function containing `pc` (a return address or a kernel's entry), without
// its parameter list, or "?".
std::string function_name(const void* pc);
// The mangled name of the function starting at `f`, empty when none does.
std::string mangled_name(const void* f);
// "function+0x1c": the function containing `pc` and the offset of `pc` in it, for naming an access site.
std::string code_site(const void* pc);
// The entries of the functions whose mangled name contains `fragment` (an identifier appears in it as written).
std::vector<const void*> functions_containing(const char* fragment);
// The __shared__ array containing p: its name and extent; false when p is in the shared section but in none.
struct SharedArray {
  uintptr_t begin = 0;
  size_t bytes = 0;
  const char* name = "";
};
bool shared_array(uintptr_t p, SharedArray* out);
// Every __shared__ array of the program.
const std::vector<SharedArray>& shared_arrays();
// The section holding every __shared__ variable (cuda_runtime.h), empty when the program has none.
uintptr_t shared_section_begin();
uintptr_t shared_section_end();

// ---- memory.cpp ----

enum class Space { Device, Pinned };
struct Allocation {
  uintptr_t begin = 0;
  size_t bytes = 0;
  Space space = Space::Device;
  bool live = false;
};
// Page-aligned memory in the space's arena, followed by at least one page that belongs to no allocation; null when
// the emulated device is full. Device memory starts uninitialised; pinned memory is host memory (always
// initialised for the checks).
void* allocate(Space s, size_t bytes);
// False when p is not the start of a live allocation of that space. The addresses are never handed out again,
// so a later access through a stale pointer is a use after free, not a silent hit in a new allocation.
bool release(Space s, void* p);
// The allocation (live or freed) containing p, else the nearest one before it; null when none.
const Allocation* allocation_near(uintptr_t p);
bool in_arena(Space s, uintptr_t p);
constexpr size_t kArenaBytes = size_t(1) << 40;  // address space reserved per arena
// The arenas' starts and the device shadow's, fixed once memory is first used (the access hooks keep copies).
struct Arenas {
  uintptr_t device = 0, pinned = 0;
  uint8_t* shadow = nullptr;  // shadow[p - device] is device byte p's state
};
const Arenas& arenas();
size_t device_bytes_in_use();
// The emulated device's memory: 16 GiB, or YUAN_EMU_DEVICE_MB MiB (a test's small GPU, or an H100's 80 GB).
size_t device_memory_bytes();

// Per-byte state of the device arena (Arenas::shadow).
enum : uint8_t { kNoAccess = 0, kUninitialised = 2, kInitialised = 3 };
// For host-side operations on device memory (copies, memsets, libraries): empty when [p, p + n) lies in one live
// allocation of `s` (and, for reads of device memory with check_init, is initialised), else why not.
std::string check_range(Space s, const void* p, size_t n, bool check_init);
void mark_initialised(const void* p, size_t n);
void copy_shadow(void* dst, const void* src, size_t n);  // device to device copies carry the state along

// ---- checks.cpp ----

// A kernel's access of shared memory by thread `tid` at code `pc` (ldmatrix reads on behalf of its address lanes).
void check_shared(uintptr_t p, size_t n, bool write, int tid, const void* pc);
// A new launch: accesses of its threads race with each other's only (device memory). With `journal`, each device
// byte it writes is journaled at its first write, with what it held.
void begin_launch(bool journal);
struct Journal {  // per byte, in the order of their first writes
  std::vector<uintptr_t> at;
  std::vector<uint8_t> before, state;  // the value and the initialisation shadow it had
  bool complete = true;                // false: the launch wrote more than the journal keeps
};
bool launch_used_atomics();
Journal take_journal();  // the running launch's, and journaling stops
// Puts back what a journaled launch wrote.
void undo(const Journal& j);
// Shared memory of a new block `block`: nothing in it is initialised, and all of it, the dynamic part (returned) and
// every __shared__ array, is filled with a NaN pattern.
unsigned char* begin_block_shared(size_t dynamic_bytes, uint3 block);
// Device memory freed: its race state goes (the addresses are never used again).
void forget_device(uintptr_t begin, size_t bytes);
// A barrier separates accesses: what came before no longer races with what comes after.
void barrier_shared();
// Where kernel code may touch memory that is neither device nor shared memory.
struct HostWindows {
  uintptr_t stacks_begin = 0, stacks_end = 0;  // the fibers' stacks: thread-local variables
  uintptr_t params_begin = 0, params_end = 0;  // the running kernel's parameters
};
void set_host_windows(const HostWindows& w);

// ---- kernel.cpp ----

// The thread of a kernel that is running on this OS thread, or null.
struct ThreadSite {
  int tid, warp, lane;
};
extern thread_local const ThreadSite* t_running;
// threadIdx of thread `tid` (linear index) of the running block.
uint3 thread_index(int tid);
// A failed check inside a kernel: reported, and the launch ends like a faulting kernel on a GPU (no further
// thread or block of it runs). Does not return when called from a kernel thread.
[[noreturn]] void kernel_fault(Check c, uintptr_t address, const std::string& what);
// For the race checks: the number of warp collectives warp `warp` completed, and whether one completed since
// `seq` had all of `lanes` in its mask (they synchronised, as __syncwarp would).
uint32_t warp_sync_count(int warp);
// Where the schedule lets threads switch (Schedule::switches): the running kernel thread may stop here for others.
void maybe_switch();
bool warp_synced(int warp, uint32_t seq, unsigned lanes);

// ---- warp.cpp ----

struct LaneCall {  // one lane's part of a warp collective
  WarpOp op;
  unsigned mask;
  int arg, width;
  uint64_t value;     // shuffle value, vote predicate
  uint32_t in[10];    // mma: a[4] b[2] c[4] (c as float bits)
  const void* addr;   // ldmatrix row address
  int matrices;       // ldmatrix
  bool trans;         // ldmatrix
  uint32_t out[4];    // results
  const char* file;
  int line;
  const void* pc;     // ldmatrix: the code that called it, the access site of its reads
};
// Computes every participating lane's `out` from the calls of the lanes in `mask` (lanes[i] null when lane i is not
// in it). For ldmatrix, `read` checks each row's shared-memory read on behalf of the lane that named it.
void complete_warp_op(LaneCall* const* lanes, unsigned mask,
                      const std::function<void(const void* row, int lane)>& read);

// ---- traffic.cpp ----

// The running launch's traffic count (Launch::traffic), null when the launch asks for none or runs again: the one
// test the access hooks make before counting.
struct Counter;
extern Counter* counter;
// Counting starts with the launch's first run and ends after it, when `out` is filled in.
void begin_traffic(const Launch& l);
void end_traffic(Traffic* out);
// An access of device (`global`) or shared memory at code `pc` by the running kernel thread, once it passed the
// checks.
void count_access(Counter& c, uintptr_t a, size_t n, bool global, const void* pc);
// Device bytes the launch reads or writes for the first time (checks.cpp knows from the race cells).
void count_first_touches(Counter& c, uint64_t read, uint64_t written);
// The running block ends: its requests are complete.
void end_block_traffic(Counter& c);

// ---- streams.cpp ----

// One operation on a stream. `step(block)` advances it and returns true once it is complete; with block false it
// may return false (still in flight, e.g. a pending MPI transfer) and is asked again later.
using Step = std::function<bool(bool block)>;
struct StreamState;
struct Operation;  // order.cpp, below
// Null and cudaStreamLegacy are the legacy default stream; false for a handle that is not a live stream.
bool valid_stream(cudaStream_t s);
cudaStream_t create_stream(bool blocking);
void destroy_stream(cudaStream_t s);  // runs its remaining work first
// The operation is named for reports by the API call running (Calling), or `kernel`.
std::shared_ptr<Operation> enqueue(cudaStream_t s, Step step, const void* kernel = nullptr);
// ---- order.cpp ----

// One operation as the happens-before rule sees it: a kernel, copy, memset, library call or marker on a stream
// (stream > 0, seq its number there: StreamPoint::seq), or an access of the host (stream 0). `seen[i]` is how many
// operations of stream i are ordered before it (event waits, synchronisations, the legacy stream's implicit ones),
// as the enqueue left them: what CUDA guarantees, whenever the emulator happens to run the work.
using VectorClock = std::vector<uint64_t>;
struct Operation {
  int stream = 0;
  uint64_t seq = 0;
  std::shared_ptr<const VectorClock> seen;
  const char* call = nullptr;    // the API call that enqueued it, and its caller
  const void* caller = nullptr;
  const void* kernel = nullptr;  // a launch's kernel
  // The byte ranges of device and pinned memory it read and wrote, [begin, end), gathered while it runs and checked
  // once it completed (settle).
  std::vector<std::pair<uintptr_t, uintptr_t>> reads, writes;
};
// Whether CUDA orders `a` before `b` (or they are one operation).
bool ordered(const Operation& a, const Operation& b);
// The operation running on this OS thread (its step), null in host code.
extern thread_local Operation* t_operation;
// An access of [p, p + n) by the running operation; outside any, an access of the host, checked at once. Memory
// that is neither device nor pinned is not tracked.
void note_access(const void* p, size_t n, bool write);
// The operation completed: each of its accesses is checked against the last write of its bytes (and a write
// against the reads since) and recorded. A pair CUDA does not order is a StreamRace report.
void settle(const std::shared_ptr<Operation>& op);
// The running operation's accesses so far checked the same way, not recorded: false after a report. For an
// operation that must know before it goes on (a copy whose Latest-mode watch would blame the host otherwise).
bool ordered_so_far();
// Freed memory: its history goes (the addresses are never handed out again).
void forget_order(uintptr_t begin, size_t bytes);
// The pinned host buffers of asynchronous copies that the host has not synchronised with (runtime.cpp): checked
// for a host write, and let go, once it has (host_join calls it); let go unchecked where the device writes them
// (operation `by` on a stream, whose own buffer is kept) or they are freed.
void check_owned_pinned();
void release_owned_pinned(uintptr_t begin, uintptr_t end, const Operation* by);
// "stream 3 (0x...)", "the legacy default stream", "the host": for reports (streams.cpp).
std::string stream_name(int stream);

// A point in a stream's order: after everything enqueued on it so far (an event's record), with the operation
// there (a marker) and what it is ordered after.
struct StreamPoint {
  StreamState* stream = nullptr;  // null: never recorded, always complete
  uint64_t seq = 0;
  std::shared_ptr<Operation> op;
};
StreamPoint stream_point(cudaStream_t s);
// cudaStreamWaitEvent: `s`'s later work is ordered after the point, and waits for it.
void stream_waits(cudaStream_t s, const StreamPoint& p);
// The host synchronised with a point (a stream or event synchronise, a query that found it complete, a blocking
// copy), or with everything enqueued so far (a device synchronise, cudaFree): what it does next, and the work it
// enqueues next, is ordered after.
void host_sees(const StreamPoint& p);
void host_sees_stream(cudaStream_t s);  // all of its work so far
void host_sees_all();
// A new access of the host, ordered after what it has seen.
std::shared_ptr<Operation> host_operation();
// Whether the host has synchronised with point `seq` of stream `stream` (or a later one of it).
bool host_has_seen(int stream, uint64_t seq);
// Runs the work up to a point, or all of a stream's; with block false stops at an operation still in flight and
// returns false.
bool run_until(const StreamPoint& p, bool block);
bool run_stream(cudaStream_t s, bool block);
void run_all_streams();
// The API call running now and the code that called it, for reports about work that call forced to run.
struct Calling {
  Calling(const char* call, const void* caller);
  ~Calling();
};
// "cudaStreamSynchronize (called from f)", or "a later call" outside any Calling.
std::string current_call();

// ---- runtime.cpp ----

// The error cudaGetLastError returns next (launch errors and failed calls), unless a sticky error takes its place.
cudaError_t& last_error();
// kernel.cpp: cudaFuncSetAttribute(MaxDynamicSharedMemorySize), checked at each launch of the kernel; the
// refusal's reason in *why.
cudaError_t set_shared_opt_in(const void* kernel, int bytes, std::string* why);

// ---- target.cpp ----

// What ptxas made of a kernel (its line in the ptxas table).
struct Compiled {
  int registers = -1;
  size_t static_shared = 0;
  int max_threads = 0;  // __launch_bounds__'s maximum threads per block (EIATTR_MAX_THREADS); 0 when it has none
};
// The kernel starting at `kernel` in the ptxas table, or null; *table_exists tells a kernel the table lacks from
// no table at all. Called under the lock.
const Compiled* compiled(const void* kernel, bool* table_exists);

}  // namespace yuan::emu
