// The CUDA emulator's own interface (cuda/emu, docs/EMULATOR.md): what the shadow headers of this directory, the
// launch helper (cuda/launch.cuh) and the PTX wrappers (cuda/ptx.cuh) call, and the reports tests read.
//
// A kernel runs on the host, one block at a time, each of its threads a fiber that switches only where CUDA
// threads wait for each other: __syncthreads, warp collectives (shuffles, votes, mma.sync, ldmatrix). Every
// memory access of the code in .cu files reaches the emulator's checks through compiler instrumentation (the
// -fsanitize=thread hooks, implemented by cuda/emu/checks.cpp instead of ThreadSanitizer's runtime).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace yuan::emu {

// ---- launches (cuda/launch.cuh) ----

// What one launch does to memory, as a GPU's memory system would see it (docs/EMULATOR.md, "Traffic"). Counted
// for the launches that ask (Launch::traffic), over the launch's first run.
struct Traffic {
  // Distinct device bytes read and written: a byte both read and written counts twice, as DRAM moves it twice.
  uint64_t read_bytes = 0, written_bytes = 0;
  uint64_t touched_bytes() const { return read_bytes + written_bytes; }
  // Global memory: warp-wide requests (the lanes of a warp executing one access site for the n-th time), the
  // distinct 32-byte sectors each request's lanes touch, and the distinct bytes they use of them.
  uint64_t requests = 0, sectors = 0, used_bytes = 0;
  // Bytes used over bytes in the sectors fetched: 1.0 when every request is fully coalesced.
  double sector_efficiency() const { return sectors ? double(used_bytes) / (32.0 * double(sectors)) : 1.0; }
  // Shared memory: warp-wide requests, and the wavefronts (passes through the 32 banks) they take beyond the
  // fewest their width allows: the bank conflicts.
  uint64_t shared_requests = 0, bank_conflicts = 0;
  // Theoretical occupancy on the target (resident warps per SM over the most it holds) from the registers and
  // static shared memory ptxas reports for the kernel, its block size and its dynamic shared memory; negative when
  // ptxas's report for the kernel is not known to the emulator.
  double occupancy = -1;
  int registers = -1;
  // The access sites that waste most, in words ("uncoalesced: NAME+0x1c: 16.0 sectors for 64 bytes used per request
  // (efficiency 0.12)"), for a person reading the account.
  std::vector<std::string> findings;
};
// Reads what ptxas made of each kernel (registers, static shared memory, __launch_bounds__'s maximum threads:
// build/emu/ptxas.txt, docs/EMULATOR.md "The device it stands for") from `path` instead of the table found at
// start (YUAN_EMU_PTXAS, else the build's); empty: that one again. Occupancy and the launch checks read it.
void set_ptxas_table(const std::string& path);

// ---- the device the emulator stands for ----

// The GPU whose limits cudaGetDeviceProperties reports, launches are checked against and occupancy is computed
// for. Grids sized from the SM count are as large as on that GPU, so a test shape reaches the paths it would.
struct Target {
  const char* name;         // as YUAN_EMU_TARGET and set_target spell it: h100 (the default), a100, h200
  const char* description;  // the part: "NVIDIA H100 SXM"
  int major, minor;         // compute capability
  int sms;
  int clock_khz, memory_clock_khz, memory_bus_bits;
  size_t shared_per_block;        // dynamic + static shared memory without opting in
  size_t shared_per_block_optin;  // the most cudaFuncAttributeMaxDynamicSharedMemorySize (plus static) may reach
  size_t shared_per_sm, shared_reserved_per_block, shared_unit;
  int registers_per_sm, registers_per_block, register_unit;  // registers are allocated per warp, in units
  int threads_per_sm, threads_per_block, blocks_per_sm, warp_size;
};
const Target& target();
// Chooses the target by name (empty: the default) for the launches and queries that follow; false for an unknown
// name. YUAN_EMU_TARGET sets it at start. A value the program cached from an earlier query (cuda/common.cuh's
// grid_for keeps the SM count) keeps the old target's: a run on another target sets it before the first query.
bool set_target(const std::string& name);

struct Launch {
  const void* kernel;  // the __global__ function: its name in reports, its attributes
  dim3 grid, block;
  size_t shared_bytes;  // dynamic shared memory per block
  cudaStream_t stream;
  Traffic* traffic = nullptr;  // when set, filled in once the launch has run (the caller keeps it alive until then)
};
// Enqueues the kernel on l.stream: every thread of the grid runs entry(params). `params` is the kernel's
// parameter memory (its by-value arguments), kept alive until the kernel has run. A configuration CUDA would
// refuse is returned, and kept for cudaGetLastError, as a launch does.
cudaError_t launch(const Launch& l, std::shared_ptr<const void> params, size_t params_bytes,
                   void (*entry)(const void*));

// Every kernel of the program and how many launches CUDA accepted for it so far: the functions of namespace
// yuan::gpu named *_kernel (cuda/'s convention; every instantiation of a template kernel the program holds), found in
// the symbol table, and any other function that was launched (`conventional` false). A test that runs the whole
// suite lists the conventional ones never launched: a code path of the backend no test reaches.
struct KernelLaunches {
  std::string name;
  uint64_t launches = 0;
  bool conventional = false;
};
std::vector<KernelLaunches> kernel_launches();

// The runtime calls that make the host wait for the device (cudaDeviceSynchronize, cudaStreamSynchronize,
// cudaEventSynchronize, cudaMemcpy, cudaMemset, a cudaMemcpyAsync of pageable memory, cudaFree, cudaFreeHost) or
// allocate (cudaMalloc, cudaHostAlloc), counted by call and calling function since the program started: what a
// training step may do only where it says so (a test reads them around a step).
struct HostCall {
  std::string call, caller;
  uint64_t count = 0;
};
std::vector<HostCall> host_calls();

// ---- built-in variables and block-wide operations of the running thread ----

uint3 thread_idx() __attribute__((const));
uint3 block_idx() __attribute__((const));
void sync_threads(const char* file, int line);
// This block's dynamic shared memory (the launch's shared_bytes).
unsigned char* dynamic_shared();

// ---- warp collectives: a thread waits in them until every lane its mask names has arrived ----

enum class WarpOp { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, All, Any, SyncWarp, Mma, Ldmatrix };
// The value of lane `arg`'s `value` (ShflIdx), or of the lane `arg` below / above / xor this one; 64-bit values
// move whole.
uint64_t shuffle(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);
// The ballot of `pred` over the mask's lanes (op Ballot, All or Any: the caller reduces the bits).
unsigned vote(WarpOp op, unsigned mask, bool pred, const char* file, int line);
void sync_warp(unsigned mask, const char* file, int line);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c (PTX ISA, "Matrix fragments for mma.m16n8k16"):
// the whole warp's fragments in, this lane's accumulators out.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]);
// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 (PTX ISA): lanes 8i..8i+7 give the row addresses of
// matrix i; this lane receives its fragment of each of the `matrices` matrices.
void ldmatrix(uint32_t* r, int matrices, bool trans, const void* row);

// ---- vector accesses (cuda/common.cuh's packs) ----

// One 8- or 16-byte load or store of a kernel thread, checked and counted as the one instruction a GPU executes
// (ld.global.v2/.v4, st.global.v2/.v4, or their shared forms) at the caller's code address: a copy of a struct that
// size would reach the checks as element accesses, each at a code address of its own.
void load_vector(void* out, const void* p, size_t bytes);
void store_vector(void* p, const void* in, size_t bytes);

// ---- atomics: read-modify-write of device or shared memory, checked as one access ----

enum class AtomicType { I32, U32, U64, F32, F64 };
enum class AtomicOp { Add, Sub, Min, Max, Exch, Cas, And, Or, Xor };
// The old value; `operand` and the result are the bits of an AtomicType value (Cas also takes `compare`).
uint64_t atomic(void* p, AtomicType t, AtomicOp op, uint64_t operand, uint64_t compare = 0);

// ---- the emulated cuBLASLt ----

// When true, cublasLtMatmulAlgoGetHeuristic finds no algorithm (CUBLAS_STATUS_NOT_SUPPORTED, none returned) for
// the epilogues cuBLASLt does not offer for every shape (GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, BGRADA,
// BGRADB, DGELU_BGRAD), as a GPU's library may not: the callers' unfused fallbacks then run. Default false; also
// set by YUAN_EMU_CUBLASLT_NO_FUSED=1 at start.
void set_cublaslt_refuses_fused_epilogues(bool refuse);

// ---- reports ----

enum class Check {
  OutOfBounds,       // outside every live allocation, shared array or the block's dynamic shared memory
  UseAfterFree,      // device memory already freed
  Misaligned,        // an access not aligned to its size (a GPU faults on it)
  Uninitialised,     // a read of device or shared memory that nothing wrote
  SharedRace,        // two threads, one of them writing, touch a shared byte between two barriers
  GlobalRace,        // two threads of a launch, one of them writing, touch a device byte: other blocks', or between two
                     // barriers of their block
  BarrierDivergence, // __syncthreads not reached by every thread of the block, or different ones
  WarpDivergence,    // a warp collective whose mask leaves out the caller or names a lane that does not come
  HostMemory,        // a kernel touched host memory, or host code device memory
  Launch,            // a launch CUDA refuses: block or grid size, shared memory beyond the kernel's limit
  Library,           // a CUDA, cuBLASLt or NCCL call the library would refuse or that the emulator does not model
  OrderDependence,   // a kernel that left different results when its blocks and threads ran in another order
  StreamRace,        // two operations touch a byte of device or pinned memory, one writing, and no event wait or
                     // synchronisation orders them (whatever the timing); among them the host writing the pinned
                     // buffer of an asynchronous copy before it synchronised with the copy
};
const char* check_name(Check c);

// ---- the order threads run in ----

// How each launch orders its blocks, and the threads of each block where they wait for nothing. Varied (the
// default) takes forward, reverse and a seeded shuffle in turn, launch by launch; `switches` lets a thread stop at
// random accesses of memory for the others. The seed is YUAN_EMU_SEED's, else 0: a run repeats itself. Under
// Varied, a launch that performed atomics (the one way a race-free kernel's result can depend on
// the order) runs a second time in another order, and a difference in what it wrote is an OrderDependence.
enum class Order { Forward, Reverse, Shuffled, Varied };
struct Schedule {
  Order order = Order::Varied;
  bool switches = true;
  uint64_t seed = 0;
};
void set_schedule(const Schedule& s);
Schedule schedule();

// ---- when asynchronous work runs ----

// Default: work runs when the host needs its result, pageable copies complete at the call, and an NCCL operation
// starts at its enqueue after its stream's earlier work. Latest: every asynchronous operation (kernels, copies of
// pinned or pageable memory, NCCL) runs at the sync, event wait or stream wait that forces it, and a
// device-to-host pinned destination holds a NaN pattern from the enqueue until then (what a host read before the
// synchronise gets; a host write before it is a StreamRace in every mode). Earliest: every operation runs at its
// enqueue, as far as its dependencies allow. YUAN_EMU_STREAMS=default|latest|earliest sets the mode at start.
enum class StreamMode { Default, Latest, Earliest };
void set_stream_mode(StreamMode m);
StreamMode stream_mode();

struct Report {
  Check check;
  std::string kernel;  // empty outside kernels
  uint3 block{}, thread{};
  uintptr_t address = 0;
  std::string message;  // one line naming all of the above
};
// The reports made since the last call, oldest first. Taking them also clears the error CUDA calls return after a
// failed kernel, so that a test can plant a bug and go on.
std::vector<Report> take_reports();
// Reports made so far and not taken.
size_t pending_reports();

}  // namespace yuan::emu
