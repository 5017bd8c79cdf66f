// The CUDA emulator's own tests (bin/test_cuda_emu; the file is empty in the GPU build). Each kind of bug the
// emulator checks for (yuan::emu::Check) is planted in a small kernel and must come back as exactly one report
// naming the kernel, block, thread and address, with the CUDA error a faulting kernel leaves; correct code of the
// same shape must raise none. Then what the emulated instructions compute, against the PTX ISA's definitions
// written out again here; the conversions' rounding against cuda_bf16.h / cuda_fp16.h's documented results; the
// cuBLASLt and NCCL argument checks; the stream order, in which a missing wait shows, and the stream modes
// (latest, earliest) that show what the default order hides; and the happens-before rule, which reports a missing
// wait between streams in every mode.
#ifdef YUAN_EMU
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cast.cuh"
#include "classifier.cuh"
#include "common.cuh"
#include "gpu_test.h"
#include "launch.cuh"
#include "ops/reference_ops.h"
#include "ptx.cuh"

namespace {

using yuan::emu::Check;
using yuan::emu::Order;
using yuan::emu::Report;
using yuan::emu::Schedule;
using yuan::gpu::dynamic_smem;
using yuan::gpu::launch;

// Exactly n elements of device memory (the tests' DevArray keeps 16 spare bytes, which would hide an overrun),
// zeroed unless asked not to; the legacy stream's memset is finished, since non-blocking streams do not wait for it.
template <typename T>
struct Exact {
  T* p = nullptr;
  explicit Exact(size_t n, bool zero = true) {
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    if (zero) CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Exact() { cudaFree(p); }
  std::vector<T> download(size_t n) const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::string all(const std::vector<Report>& reps) {
  std::string s;
  for (const Report& r : reps) s += "\n  " + r.message;
  return s;
}

// The kernels ran (and the planted one failed with `error`); its one report is of check `c` by `thread` of `block`
// in `kernel`, about `address` (0: any), and says `says`.
void expect_report(cudaError_t error, Check c, const char* kernel, uint3 block, uint3 thread, const void* address,
                   const char* says) {
  EXPECT_EQ(cudaDeviceSynchronize(), error);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  const Report& r = reps[0];
  EXPECT_EQ(r.check, c) << r.message;
  EXPECT_NE(r.kernel.find(kernel), std::string::npos) << r.message;
  EXPECT_EQ(r.block.x, block.x) << r.message;
  EXPECT_EQ(r.block.y, block.y) << r.message;
  EXPECT_EQ(r.thread.x, thread.x) << r.message;
  EXPECT_EQ(r.thread.y, thread.y) << r.message;
  if (address) {
    EXPECT_EQ(r.address, reinterpret_cast<uintptr_t>(address)) << r.message;
  }
  EXPECT_NE(r.message.find(says), std::string::npos) << r.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "taking the reports clears the error";
}

void expect_no_report() {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(yuan::emu::take_reports().size(), 0u);
}

// The schedule (cuda_emu.h) for as long as it lives, then the one before.
struct Pinned {
  explicit Pinned(Schedule s) : saved(yuan::emu::schedule()) { yuan::emu::set_schedule(s); }
  ~Pinned() { yuan::emu::set_schedule(saved); }
  Schedule saved;
};

// Which thread trips a planted bug first depends on the order threads run in: the checks' tests run one order
// (forward, no switches), the schedule's own tests further down vary it.
class EmulatorChecks : public ::testing::Test {
  Pinned pinned_{Schedule{Order::Forward, false, 0}};
};

// ---- device memory ----

__global__ void copy_upto(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = in[i];  // the planted bug: <= n
}

TEST_F(EmulatorChecks, ReadPastTheEndOfAnAllocation) {
  const int n = 100;
  Exact<float> in(n), out(n + 1);
  launch(copy_upto, 2, 64, 0, 0, out.p, in.p, n);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "copy_upto", {1, 0, 0}, {36, 0, 0}, in.p + n,
                "0 bytes past the end of a 400-byte allocation");
}

TEST_F(EmulatorChecks, WritePastTheEndOfAnAllocation) {
  const int n = 100;
  Exact<float> in(n + 1), out(n);
  launch(copy_upto, 2, 64, 0, 0, out.p, in.p, n);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "copy_upto", {1, 0, 0}, {36, 0, 0}, out.p + n, "write");
}

TEST_F(EmulatorChecks, UseAfterFree) {
  float* in = nullptr;
  Exact<float> out(65);
  CUDA_CHECK(cudaMalloc(&in, 65 * sizeof(float)));
  CUDA_CHECK(cudaMemset(in, 0, 65 * sizeof(float)));
  CUDA_CHECK(cudaFree(in));
  launch(copy_upto, 1, 64, 0, 0, out.p, in, 64);
  expect_report(cudaErrorIllegalAddress, Check::UseAfterFree, "copy_upto", {0, 0, 0}, {0, 0, 0}, in, "freed");
}

TEST_F(EmulatorChecks, ReadOfUninitialisedDeviceMemory) {
  Exact<float> in(65, false), out(65);
  launch(copy_upto, 1, 64, 0, 0, out.p, in.p, 64);
  expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "copy_upto", {0, 0, 0}, {0, 0, 0}, in.p,
                "was never written");
}

__global__ void load_double_at(double* out, const char* in, int offset) {
  *out = *reinterpret_cast<const double*>(in + offset);
}

TEST_F(EmulatorChecks, MisalignedAccess) {
  Exact<char> in(64);
  Exact<double> out(1);
  launch(load_double_at, 1, 1, 0, 0, out.p, in.p, 8);
  expect_no_report();
  launch(load_double_at, 1, 1, 0, 0, out.p, in.p, 4);
  expect_report(cudaErrorMisalignedAddress, Check::Misaligned, "load_double_at", {0, 0, 0}, {0, 0, 0}, in.p + 4,
                "not a multiple of 8");
}

TEST_F(EmulatorChecks, KernelReadingHostMemory) {
  std::vector<float> host(65, 1.0f);
  Exact<float> out(65);
  launch(copy_upto, 1, 64, 0, 0, out.p, host.data(), 64);
  expect_report(cudaErrorIllegalAddress, Check::HostMemory, "copy_upto", {0, 0, 0}, {0, 0, 0}, host.data(),
                "host memory");
}

TEST_F(EmulatorChecks, HostCodeReadingDeviceMemory) {
  Exact<float> d(4);
  volatile float sink = d.p[1];  // compiled in this (instrumented) file: a segfault on a GPU machine
  (void)sink;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  EXPECT_EQ(reps[0].check, Check::HostMemory);
  EXPECT_TRUE(reps[0].kernel.empty());
  EXPECT_EQ(reps[0].address, reinterpret_cast<uintptr_t>(d.p + 1));
  EXPECT_NE(reps[0].message.find("host code reads"), std::string::npos) << reps[0].message;
}

// ---- shared memory ----

__global__ void fill_dynamic(float* out) {
  float* s = dynamic_smem<float>();
  s[threadIdx.x] = 1.0f;
  out[threadIdx.x] = s[threadIdx.x];
}

TEST_F(EmulatorChecks, DynamicSharedMemoryOverrun) {
  Exact<float> out(65);
  launch(fill_dynamic, 1, 64, 64 * sizeof(float), 0, out.p);
  expect_no_report();
  launch(fill_dynamic, 1, 65, 64 * sizeof(float), 0, out.p);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "fill_dynamic", {0, 0, 0}, {64, 0, 0}, nullptr,
                "offset 256 of dynamic shared memory, which is 256 bytes");
}

__global__ void shift_into_array(float* out) {
  __shared__ float tile[32];
  tile[threadIdx.x + 1] = 1.0f;  // the planted bug: thread 31 writes tile[32]
  __syncthreads();
  out[threadIdx.x] = tile[threadIdx.x];
}

TEST_F(EmulatorChecks, StaticSharedArrayOverrun) {
  Exact<float> out(32);
  launch(shift_into_array, 1, 32, 0, 0, out.p);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "shift_into_array", {0, 0, 0}, {31, 0, 0}, nullptr,
                "0 bytes past the end of shared array (anonymous namespace)::shift_into_array::tile (128 bytes)");
}

__global__ void read_unwritten_shared(float* out) {
  __shared__ float s[64];
  if (threadIdx.x % 2 == 0) s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

TEST_F(EmulatorChecks, ReadOfUninitialisedSharedMemory) {
  Exact<float> out(64);
  launch(read_unwritten_shared, 1, 64, 0, 0, out.p);
  // The last thread at the barrier opens it and runs on first: thread 63 reads before thread 1 does.
  expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "read_unwritten_shared", {0, 0, 0}, {63, 0, 0},
                nullptr, "which no thread of this block wrote");
}

// mode 0: neighbours swap through shared memory after a barrier (correct); 1: without it (a race); 2: every
// thread writes s[0] (a write-write race); 3: a warp swaps after __syncwarp (correct: lanes of a warp that
// synchronised).
__global__ void swap_neighbours(float* out, int mode) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = 0.0f;
  __syncthreads();
  if (mode == 2) {
    s[0] = static_cast<float>(t);
    return;
  }
  s[t] = static_cast<float>(t);
  if (mode == 0) __syncthreads();
  if (mode == 3) __syncwarp();
  out[t] = s[t ^ 1];
}

TEST_F(EmulatorChecks, SharedMemoryRaces) {
  Exact<float> out(64);
  for (int mode : {0, 3}) {
    launch(swap_neighbours, 1, 64, 0, 0, out.p, mode);
    expect_no_report();
    const std::vector<float> got = out.download(64);
    for (int t = 0; t < 64; t++) ASSERT_EQ(got[t], static_cast<float>(t ^ 1)) << "mode " << mode;
  }
  launch(swap_neighbours, 1, 64, 0, 0, out.p, 1);
  expect_report(cudaErrorLaunchFailure, Check::SharedRace, "swap_neighbours", {0, 0, 0}, {1, 0, 0}, nullptr,
                "write of shared array (anonymous namespace)::swap_neighbours::s at offset 4, which thread (0,0,0) "
                "read since the last barrier");
  launch(swap_neighbours, 2, 64, 0, 0, out.p, 2);  // thread 63 opened the barrier and wrote first
  expect_report(cudaErrorLaunchFailure, Check::SharedRace, "swap_neighbours", {0, 0, 0}, {0, 0, 0}, nullptr,
                "write of shared array (anonymous namespace)::swap_neighbours::s at offset 0, which thread (63,0,0) "
                "wrote since the last barrier");
}

// A template kernel's __shared__ array (GCC drops a section attribute from the statics of function templates; the
// build gathers them by their alignment instead, cuda/emu/gather_shared.sh). Mode 0: neighbours swap after a
// barrier (correct); 1: odd threads never write their slot (an uninitialised read); 2: each thread overwrites its
// slot after the barrier while its neighbour may still read it (a race).
template <int Mode>
__global__ void template_swap(float* out) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  if (Mode != 1 || t % 2 == 0) s[t] = static_cast<float>(t);
  __syncthreads();
  const float v = s[t ^ 1];
  if (Mode == 2) s[t] = -v;
  out[t] = v;
}

TEST_F(EmulatorChecks, SharedMemoryOfTemplateKernels) {
  Exact<float> out(64);
  launch(template_swap<0>, 1, 64, 0, 0, out.p);
  expect_no_report();
  const std::vector<float> got = out.download(64);
  for (int t = 0; t < 64; t++) ASSERT_EQ(got[t], static_cast<float>(t ^ 1));
  // Thread 63 opens the barrier and reads its even neighbour's slot; thread 0 then reads thread 1's.
  launch(template_swap<1>, 1, 64, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "template_swap<1>", {0, 0, 0}, {0, 0, 0}, nullptr,
                "read of shared array (anonymous namespace)::template_swap<1>::s at offset 4, which no thread of this "
                "block wrote");
  launch(template_swap<2>, 1, 64, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::SharedRace, "template_swap<2>", {0, 0, 0}, {1, 0, 0}, nullptr,
                "read of shared array (anonymous namespace)::template_swap<2>::s at offset 0, which thread (0,0,0) "
                "wrote since the last barrier (its write in (anonymous namespace)::template_swap<2>)");
}

// Shared memory is each block's own: block 1 finds garbage where block 0 left its values, which it must not read.
template <typename T>
__global__ void read_other_blocks_shared(T* out) {
  __shared__ T s[32];
  if (blockIdx.x == 0) s[threadIdx.x] = T(1);
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

TEST_F(EmulatorChecks, SharedMemoryIsPerBlock) {
  Exact<float> out(64);
  launch(read_other_blocks_shared<float>, 2, 32, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "read_other_blocks_shared<float>", {1, 0, 0},
                {31, 0, 0}, nullptr, "which no thread of this block wrote");
}

// ---- device-memory races ----

// mode 0: every thread adds with atomicAdd (correct); 1: with a plain += (the block's threads race); 2: one thread
// per block adds with a plain += (the blocks race).
__global__ void add_up(float* total, int mode) {
  if (mode == 0) atomicAdd(total, 1.0f);
  if (mode == 1) *total += 1.0f;
  if (mode == 2 && threadIdx.x == 0) *total += 1.0f;
}

TEST_F(EmulatorChecks, APlainAddWhereAnAtomicIsNeeded) {
  Exact<float> total(1);
  launch(add_up, 4, 64, 0, 0, total.p, 0);
  expect_no_report();
  EXPECT_EQ(total.download(1)[0], 256.0f);
  launch(add_up, 4, 64, 0, 0, total.p, 1);
  expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "add_up", {0, 0, 0}, {1, 0, 0}, total.p,
                "read of device memory at 0x");
  launch(add_up, 4, 64, 0, 0, total.p, 2);
  expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "add_up", {1, 0, 0}, {0, 0, 0}, total.p,
                "which thread (0,0,0) of block (0,0,0) wrote in this launch (its write in (anonymous "
                "namespace)::add_up)");
}

// Each block leaves a partial sum; the last block adds them up in the same launch, as if the others had finished
// (nothing on a GPU says they have: the correct form is a second launch, sum_partials).
__global__ void partials_then_last_block_sums(float* partials, float* total) {
  if (threadIdx.x != 0) return;
  partials[blockIdx.x] = blockIdx.x + 1.0f;
  if (blockIdx.x != gridDim.x - 1) return;
  float sum = 0.0f;
  for (unsigned b = 0; b < gridDim.x; b++) sum += partials[b];
  *total = sum;
}

__global__ void write_partial(float* partials) {
  if (threadIdx.x == 0) partials[blockIdx.x] = blockIdx.x + 1.0f;
}

__global__ void sum_partials(const float* partials, float* total, int n) {
  float sum = 0.0f;
  for (int b = 0; b < n; b++) sum += partials[b];
  *total = sum;
}

TEST(EmulatorRaces, TheLastBlockReadingOtherBlocksPartials) {
  Exact<float> partials(4), total(1);
  for (Order order : {Order::Forward, Order::Reverse}) {
    Pinned pin(Schedule{order, false, 0});
    launch(write_partial, 4, 32, 0, 0, partials.p);
    launch(sum_partials, 1, 1, 0, 0, partials.p, total.p, 4);
    expect_no_report();
    EXPECT_EQ(total.download(1)[0], 10.0f);
    launch(partials_then_last_block_sums, 4, 32, 0, 0, partials.p, total.p);
    // Forward, block 3 reads what block 0 wrote; in reverse it runs first, and block 2 overwrites what it read.
    if (order == Order::Forward)
      expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "partials_then_last_block_sums", {3, 0, 0}, {0, 0, 0},
                    partials.p, "which thread (0,0,0) of block (0,0,0) wrote in this launch");
    else
      expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "partials_then_last_block_sums", {2, 0, 0}, {0, 0, 0},
                    partials.p + 2, "which thread (0,0,0) of block (3,0,0) read in this launch");
  }
}

// Neighbouring threads write neighbouring bf16 values (no race: different bytes); a barrier orders a block's write
// before another thread's read; blocks each read what all of them only read.
__global__ void race_free_sharing(__nv_bfloat16* out, const float* shared_input, float* staging) {
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  out[i] = __float2bfloat16(shared_input[0] + t);
  staging[i] = static_cast<float>(t);
  __syncthreads();
  out[i] = __float2bfloat16(staging[blockIdx.x * blockDim.x + (t ^ 1)]);
}

TEST(EmulatorRaces, OrderedAndDisjointAccessesDoNotRace) {
  Exact<__nv_bfloat16> out(128);
  Exact<float> input(1), staging(128);
  for (Order order : {Order::Forward, Order::Reverse, Order::Shuffled}) {
    Pinned pin(Schedule{order, true, 3});
    launch(race_free_sharing, 2, 64, 0, 0, out.p, input.p, staging.p);
    expect_no_report();
  }
}

// ---- the schedule ----

// Block b records when it ran: a result that depends on the order by design, so the orders are pinned one by one.
__global__ void record_arrival(unsigned* counter, unsigned* arrival) {
  if (threadIdx.x == 0) arrival[blockIdx.x] = atomicAdd(counter, 1u);
}

TEST(EmulatorSchedule, BlocksRunForwardInReverseOrShuffled) {
  const int n = 16;
  Exact<unsigned> counter(1), arrival(n);
  std::vector<unsigned> forward(n), reverse(n);
  for (int b = 0; b < n; b++) forward[b] = b, reverse[b] = n - 1 - b;
  for (Order order : {Order::Forward, Order::Reverse, Order::Shuffled}) {
    Pinned pin(Schedule{order, true, 0});
    CUDA_CHECK(cudaMemset(counter.p, 0, sizeof(unsigned)));
    launch(record_arrival, n, 32, 0, 0, counter.p, arrival.p);
    expect_no_report();
    const std::vector<unsigned> got = arrival.download(n);
    if (order == Order::Forward) {
      EXPECT_EQ(got, forward);
    } else if (order == Order::Reverse) {
      EXPECT_EQ(got, reverse);
    } else {
      EXPECT_NE(got, forward);
      EXPECT_NE(got, reverse);
      std::vector<unsigned> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, forward) << "a permutation: every block ran once";
    }
  }
}

// With the default schedule a launch that used atomics runs a second time in another order: one whose result
// depends on the order is reported (an atomic sum that comes out the same either way is not: AtomicsDoNotRace).
TEST(EmulatorSchedule, AResultThatDependsOnTheOrderIsReported) {
  Pinned pin(Schedule{Order::Varied, true, 0});
  const int n = 16;
  Exact<unsigned> counter(1), arrival(n);
  launch(record_arrival, n, 32, 0, 0, counter.p, arrival.p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  EXPECT_EQ(reps[0].check, Check::OrderDependence) << reps[0].message;
  EXPECT_NE(reps[0].message.find("record_arrival"), std::string::npos) << reps[0].message;
  EXPECT_GE(reps[0].address, reinterpret_cast<uintptr_t>(arrival.p)) << reps[0].message;
  EXPECT_LT(reps[0].address, reinterpret_cast<uintptr_t>(arrival.p + n)) << reps[0].message;
  EXPECT_NE(reps[0].message.find("when the blocks and threads run"), std::string::npos) << reps[0].message;
}

// Every thread takes two tickets: run one at a time, thread t would hold 2t and 2t+1; switched at random accesses,
// other threads take tickets in between.
__global__ void two_tickets(unsigned* counter, unsigned* tickets) {
  const unsigned first = atomicAdd(counter, 1u);
  const unsigned second = atomicAdd(counter, 1u);
  tickets[threadIdx.x] = second - first;
}

TEST(EmulatorSchedule, ThreadsSwitchAtRandomAccesses) {
  Exact<unsigned> counter(1), tickets(64);
  for (bool switches : {false, true}) {
    Pinned pin(Schedule{Order::Forward, switches, 0});
    CUDA_CHECK(cudaMemset(counter.p, 0, sizeof(unsigned)));
    launch(two_tickets, 1, 64, 0, 0, counter.p, tickets.p);
    expect_no_report();
    const std::vector<unsigned> got = tickets.download(64);
    const int apart = static_cast<int>(std::count_if(got.begin(), got.end(), [](unsigned d) { return d != 1; }));
    if (switches)
      EXPECT_GT(apart, 0) << "some thread was switched out between its two tickets";
    else
      EXPECT_EQ(apart, 0);
  }
}

// ---- alignment at the width of the access ----

// A 16-byte pack, an 8-byte float2 and a 4-byte bf16 pair, read and written at `offset` elements into bf16 arrays.
// The optimiser splits the pack's copy into eight 2-byte loads, each aligned; the GPU's one 16-byte load is not.
__global__ void vector_access(__nv_bfloat16* out, const __nv_bfloat16* in, int which, int offset) {
  if (which == 0) yuan::gpu::store_pack(out, yuan::gpu::load_pack(in + offset));
  if (which == 1) *reinterpret_cast<float2*>(out) = *reinterpret_cast<const float2*>(in + offset);
  if (which == 2) *reinterpret_cast<__nv_bfloat162*>(out) = *reinterpret_cast<const __nv_bfloat162*>(in + offset);
  if (which == 3) yuan::gpu::store_pack(out + offset, yuan::gpu::load_pack(in));
}

TEST_F(EmulatorChecks, VectorAccessesAlignedToTheirWidth) {
  Exact<__nv_bfloat16> in(32), out(32);
  const struct {
    int which, aligned, misaligned, bytes;
    const char* type;
  } cases[] = {{0, 8, 1, 16, "const struct Pack"},
               {1, 4, 2, 8, "const struct float2"},
               {2, 2, 1, 4, "const struct __nv_bfloat162"},
               {3, 8, 3, 16, "struct Pack"}};
  for (const auto& c : cases) {
    launch(vector_access, 1, 1, 0, 0, out.p, in.p, c.which, c.aligned);
    expect_no_report();
    launch(vector_access, 1, 1, 0, 0, out.p, in.p, c.which, c.misaligned);
    const __nv_bfloat16* at = (c.which == 3 ? out.p : in.p) + c.misaligned;
    const std::string says = yuan::strf("access of '%s' at %p, not a multiple of %d, its type's alignment", c.type,
                                        static_cast<const void*>(at), c.bytes);
    expect_report(cudaErrorMisalignedAddress, Check::Misaligned, "vector_access", {0, 0, 0}, {0, 0, 0}, at,
                  says.c_str());
  }
}

// ---- barriers and warps ----

__global__ void early_return(float* out) {
  if (threadIdx.x < 32) return;  // the planted bug: half the block leaves before the barrier
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

TEST_F(EmulatorChecks, BarrierNotReachedByEveryThread) {
  Exact<float> out(64);
  launch(early_return, 1, 64, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::BarrierDivergence, "early_return", {0, 0, 0}, {63, 0, 0}, nullptr,
                "thread (0,0,0) exited without reaching the __syncthreads at tests/cuda/test_emulator.cu");
}

__global__ void two_barriers(float* out) {
  if (threadIdx.x % 2)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1.0f;
}

TEST_F(EmulatorChecks, ThreadsWaitingAtDifferentBarriers) {
  Exact<float> out(64);
  launch(two_barriers, 1, 64, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::BarrierDivergence, "two_barriers", {0, 0, 0}, {63, 0, 0}, nullptr,
                "at the one at tests/cuda/test_emulator.cu");
}

// mode 0: a full-warp shuffle (correct); 1: lanes 16-31 call with a mask of lanes 0-15; 2: lanes 16-31 return
// first; 3: lanes 0-15 wait at a barrier the others never reach while those shuffle.
__global__ void shuffle_modes(float* out, int mode) {
  const int lane = threadIdx.x % 32;
  float v = static_cast<float>(threadIdx.x);
  if (mode == 1) v = __shfl_xor_sync(0x0000ffffu, v, 1);
  if (mode == 2 && lane >= 16) return;
  if (mode == 3 && lane < 16) __syncthreads();
  if (mode != 1) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

TEST_F(EmulatorChecks, ShuffleMasks) {
  Exact<float> out(32);
  launch(shuffle_modes, 1, 32, 0, 0, out.p, 0);
  expect_no_report();
  const std::vector<float> got = out.download(32);
  for (int t = 0; t < 32; t++) ASSERT_EQ(got[t], static_cast<float>(t ^ 1));
  launch(shuffle_modes, 1, 32, 0, 0, out.p, 1);
  expect_report(cudaErrorLaunchFailure, Check::WarpDivergence, "shuffle_modes", {0, 0, 0}, {16, 0, 0}, nullptr,
                "with mask 0x0000ffff, which leaves out the calling lane 16");
  launch(shuffle_modes, 1, 32, 0, 0, out.p, 2);
  expect_report(cudaErrorLaunchFailure, Check::WarpDivergence, "shuffle_modes", {0, 0, 0}, {16, 0, 0}, nullptr,
                "exited while lane 0 waits in __shfl_xor_sync (mask 0xffffffff)");
  launch(shuffle_modes, 1, 32, 0, 0, out.p, 3);
  expect_report(cudaErrorLaunchFailure, Check::WarpDivergence, "shuffle_modes", {0, 0, 0}, {16, 0, 0}, nullptr,
                "which waits at the __syncthreads at tests/cuda/test_emulator.cu");
}

__global__ void shuffle_from_inactive_lane(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);
}

TEST_F(EmulatorChecks, ShuffleFromALaneOutsideTheMask) {
  Exact<float> out(32);
  launch(shuffle_from_inactive_lane, 1, 32, 0, 0, out.p);
  expect_report(cudaErrorLaunchFailure, Check::WarpDivergence, "shuffle_from_inactive_lane", {0, 0, 0},
                {15, 0, 0}, nullptr, "reads lane 20, which is not in the mask");
}

// ---- launches ----

TEST_F(EmulatorChecks, LaunchesCudaRefuses) {
  Exact<float> out(64);
  EXPECT_THROW(launch(fill_dynamic, 1, 64, 64 << 10, 0, out.p), yuan::Error) << "64 KiB without opting in";
  std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  EXPECT_EQ(reps[0].check, Check::Launch);
  EXPECT_NE(reps[0].message.find("cudaFuncSetAttribute"), std::string::npos) << reps[0].message;
  CUDA_CHECK(cudaFuncSetAttribute(fill_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
  launch(fill_dynamic, 1, 64, 64 << 10, 0, out.p);
  expect_no_report();
  EXPECT_THROW(launch(fill_dynamic, 1, 2048, 0, 0, out.p), yuan::Error) << "2048 threads";
  EXPECT_THROW(launch(fill_dynamic, dim3(1, 70000), 32, 0, 0, out.p), yuan::Error) << "grid.y 70000";
  EXPECT_EQ(yuan::emu::take_reports().size(), 2u);
}

// ---- the device it stands for (docs/EMULATOR.md) ----

// The target (cuda_emu.h) for as long as it lives, then the default.
struct OnTarget {
  explicit OnTarget(const char* name) { EXPECT_TRUE(yuan::emu::set_target(name)) << name; }
  ~OnTarget() { yuan::emu::set_target(""); }
};

TEST(EmulatorTarget, TheDeviceIsTheTargets) {
  auto props = [] {
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    return p;
  };
  const cudaDeviceProp h100 = props();
  EXPECT_EQ(h100.multiProcessorCount, 132);
  EXPECT_EQ(h100.major * 10 + h100.minor, 90);
  EXPECT_EQ(h100.sharedMemPerBlock, size_t(48) << 10);
  EXPECT_EQ(h100.sharedMemPerBlockOptin, size_t(227) << 10);
  EXPECT_EQ(h100.sharedMemPerMultiprocessor, size_t(228) << 10);
  EXPECT_EQ(h100.regsPerBlock, 65536);
  EXPECT_EQ(h100.regsPerMultiprocessor, 65536);
  EXPECT_EQ(h100.maxThreadsPerMultiProcessor, 2048);
  EXPECT_EQ(h100.maxBlocksPerMultiProcessor, 32);
  EXPECT_NE(std::string(h100.name).find("H100"), std::string::npos) << h100.name;
  int sms = 0;
  {
    OnTarget a100("a100");
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    EXPECT_EQ(sms, 108);
    EXPECT_EQ(props().sharedMemPerBlockOptin, size_t(163) << 10);
    EXPECT_EQ(props().major, 8);
    // Opting in to what an H100 allows a block is refused on an A100.
    EXPECT_EQ(cudaFuncSetAttribute(fill_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10),
              cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    std::vector<Report> reps = yuan::emu::take_reports();
    ASSERT_EQ(reps.size(), 1u) << all(reps);
    EXPECT_NE(reps[0].message.find("above the 166912 the NVIDIA A100 SXM4 allows"), std::string::npos)
        << reps[0].message;
  }
  {
    OnTarget h200("h200");
    EXPECT_EQ(props().multiProcessorCount, 132);
    EXPECT_EQ(props().memoryBusWidth, 6144);
  }
  EXPECT_FALSE(yuan::emu::set_target("v100"));
  EXPECT_EQ(props().multiProcessorCount, 132) << "an unknown name leaves the target as it was";
}

// Blocks for a grid-stride loop over n items, as cuda/common.cuh's grid_for sizes them (enough to fill the device 8
// times over, no more), from the SM count of the target at the call.
unsigned blocks_for(size_t n, unsigned threads) {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, size_t(8) * sms));
}

// out = 2 in over a grid-stride loop; the planted bug (`one_stride`): the loop was dropped, each thread doing only
// the first element it meets. A device with few SMs never needs a second stride at a test's sizes.
__global__ void twice(float* out, const float* in, size_t n, bool one_stride) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = 2.0f * in[i];
    if (one_stride) break;
  }
}

// What a consumer of twice's output does: reads all of it (an element nothing wrote is an Uninitialised).
__global__ void sum_all(float* total, const float* x, size_t n) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(total, x[i]);
}

// twice with or without its loop over n elements, 32 threads a block, then its output read: reported or not.
bool dropped_stride_reported(size_t n, bool one_stride) {
  Exact<float> in(n), out(n, false), total(1);
  launch(twice, blocks_for(n, 32), 32, 0, 0, out.p, in.p, n, one_stride);
  launch(sum_all, 1, 32, 0, 0, total.p, out.p, n);
  const bool failed = cudaDeviceSynchronize() != cudaSuccess;
  const std::vector<Report> reps = yuan::emu::take_reports();
  for (const Report& r : reps) EXPECT_EQ(r.check, Check::Uninitialised) << r.message;
  return failed;
}

// An H100 caps the loop's grid at 8 x 132 = 1056 blocks: 33,792 elements in one stride, a second above. A test
// shape below that passes with the loop dropped; one element more shows it, and on an A100 (864 blocks) 27,649 do.
TEST_F(EmulatorChecks, AGridStrideLoopDroppedShowsOnlyAboveTheFirstStride) {
  const size_t stride = 1056 * 32;
  EXPECT_FALSE(dropped_stride_reported(stride, true)) << "one stride covers it: what the tests' shapes let through";
  EXPECT_FALSE(dropped_stride_reported(stride + 1, false));
  {
    Exact<float> in(stride + 1), out(stride + 1, false), total(1);
    launch(twice, blocks_for(stride + 1, 32), 32, 0, 0, out.p, in.p, stride + 1, true);
    launch(sum_all, 1, 32, 0, 0, total.p, out.p, stride + 1);
    expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "sum_all", {0, 0, 0}, {0, 0, 0}, out.p + stride,
                  "was never written");
  }
  OnTarget a100("a100");
  EXPECT_TRUE(dropped_stride_reported(864 * 32 + 1, true));
  EXPECT_FALSE(dropped_stride_reported(864 * 32 + 1, false));
}

// Per-block partial sums of squares into `partials`, a slot a block (grad_norm.cu's first stage). The planted bug:
// the caller sizes the grid from the SM count without capping it at the partials' 1024 slots.
__global__ void partial_squares(double* partials, const float* x, size_t n) {
  double acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc += static_cast<double>(x[i]) * x[i];
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;  // the other threads' sums are dropped: only the grid matters
}

// 1024 partials and the result after them, as grad_norm.cu keeps them: 1025 doubles. An A100's 864 blocks fit
// uncapped; an H100's 1056 write past the end, unless the grid is capped.
TEST_F(EmulatorChecks, AGridNotCappedAtItsBufferWritesPastIt) {
  constexpr unsigned kMaxBlocks = 1024;
  const size_t n = 1 << 20;
  Exact<float> x(n);
  Exact<double> partials(kMaxBlocks + 1);
  launch(partial_squares, std::min(blocks_for(n, 32), kMaxBlocks), 32, 0, 0, partials.p, x.p, n);
  expect_no_report();
  {
    OnTarget a100("a100");
    launch(partial_squares, blocks_for(n, 32), 32, 0, 0, partials.p, x.p, n);
    expect_no_report();
  }
  launch(partial_squares, blocks_for(n, 32), 32, 0, 0, partials.p, x.p, n);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "partial_squares", {kMaxBlocks + 1, 0, 0}, {0, 0, 0},
                partials.p + kMaxBlocks + 1, "write");
}

}  // namespace

// Named outside the anonymous namespace, so that a test can spell their mangled names in a ptxas table. The
// emulator's headers cannot see __launch_bounds__ (it expands to nothing for g++): the table states it, as
// cuobjdump reads it from the kernel's cubin (EIATTR_MAX_THREADS).
namespace launch_probe {
__global__ void __launch_bounds__(64) bounded(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void many_registers(float* out) { out[threadIdx.x] = 1.0f; }
}  // namespace launch_probe

namespace {

// A ptxas table the test writes for the probes, as the build writes build/emu/ptxas.txt, for as long as it lives.
struct ProbeTable {
  std::string path = ::testing::TempDir() + "emulator_launch_ptxas.txt";
  explicit ProbeTable(const char* lines) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(lines, f);
    std::fclose(f);
    yuan::emu::set_ptxas_table(path);
  }
  ~ProbeTable() {
    yuan::emu::set_ptxas_table("");
    std::remove(path.c_str());
  }
};

// Launches kernel(out) on one block of `threads` as gpu::launch does, and returns what the launch returned.
cudaError_t launch_status(void (*kernel)(float*), unsigned threads, float* out) {
  using Call = yuan::gpu::detail::KernelCall<float*>;
  auto call = std::make_shared<const Call>(Call{kernel, std::tuple<float*>(out)});
  const yuan::emu::Launch l{reinterpret_cast<const void*>(kernel), 1, threads, 0, 0, nullptr};
  const cudaError_t e = yuan::emu::launch(l, call, sizeof(Call), &Call::run);
  EXPECT_EQ(cudaGetLastError(), e) << "kept for cudaGetLastError, as a launch's error is";
  return e;
}

// The one report a refused launch left: a Launch saying `says`.
void expect_refused(const char* says) {
  std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  EXPECT_EQ(reps[0].check, Check::Launch);
  EXPECT_NE(reps[0].message.find(says), std::string::npos) << reps[0].message;
}

// __launch_bounds__(64) launched with 128 threads: every launch fails on a GPU (cudaErrorInvalidValue, as the
// driver refuses a block above the function's maximum threads); 64 threads run.
TEST_F(EmulatorChecks, ABlockAboveTheKernelsLaunchBounds) {
  ProbeTable table("_ZN12launch_probe7boundedEPf 16 0 0 0 64\n");
  Exact<float> out(128);
  EXPECT_EQ(launch_status(launch_probe::bounded, 64, out.p), cudaSuccess);
  expect_no_report();
  EXPECT_EQ(launch_status(launch_probe::bounded, 128, out.p), cudaErrorInvalidValue);
  expect_refused("128 threads, above the 64 of the kernel's __launch_bounds__");
  expect_no_report();
}

// 128 registers a thread: 4096 a warp, so 16 warps fill a block's 65536; 1024 threads are refused
// (cudaErrorLaunchOutOfResources, "too many resources requested for launch"), 512 run.
TEST_F(EmulatorChecks, RegistersTimesThreadsAboveTheBlocksRegisters) {
  ProbeTable table("_ZN12launch_probe14many_registersEPf 128 0 0 0 0\n");
  Exact<float> out(1024);
  EXPECT_EQ(launch_status(launch_probe::many_registers, 512, out.p), cudaSuccess);
  expect_no_report();
  EXPECT_EQ(launch_status(launch_probe::many_registers, 1024, out.p), cudaErrorLaunchOutOfResources);
  expect_refused("32 warps of 4096 registers (128 a thread, as ptxas compiled it) are 131072, above the 65536 a "
                 "block may hold on the NVIDIA H100 SXM");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorLaunchOutOfResources), "too many resources requested for launch");
}

// A kernel of cuda/ that a table lacks (one older than the source) is refused, not run unchecked; the tests' own
// kernels are in no table and run.
TEST_F(EmulatorChecks, AKernelMissingFromThePtxasTable) {
  ProbeTable table("_ZN12launch_probe7boundedEPf 16 0 0 0 64\n");
  Exact<float> in(64);
  Exact<__nv_bfloat16> out(64);
  EXPECT_THROW(yuan::gpu::f32_to_bf16(out.p, in.p, 64, 0), yuan::Error) << "cudaErrorInvalidDeviceFunction";
  expect_refused("is not in the ptxas table");
  Exact<float> wide(1024);
  EXPECT_EQ(launch_status(launch_probe::many_registers, 1024, wide.p), cudaSuccess) << "not in the table: unchecked";
  expect_no_report();
}

// ---- what the instructions compute ----

// One shuffle of each kind: the source lane per the CUDA programming guide, here spelled out independently.
__global__ void shuffles(int* out) {
  const int lane = threadIdx.x;
  out[0 * 32 + lane] = __shfl_sync(0xffffffffu, lane, lane * 3, 8);
  out[1 * 32 + lane] = __shfl_up_sync(0xffffffffu, lane, 3, 16);
  out[2 * 32 + lane] = __shfl_down_sync(0xffffffffu, lane, 5);
  out[3 * 32 + lane] = __shfl_xor_sync(0xffffffffu, lane, 9, 8);
  out[4 * 32 + lane] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  out[5 * 32 + lane] = __all_sync(0xffffffffu, lane < 32) + 2 * __any_sync(0xffffffffu, lane == 7);
}

TEST(EmulatorInstructions, Shuffles) {
  Exact<int> out(6 * 32);
  launch(shuffles, 1, 32, 0, 0, out.p);
  expect_no_report();
  const std::vector<int> got = out.download(6 * 32);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    EXPECT_EQ(got[l], (l & ~7) + (l * 3) % 8) << "idx, width 8, lane " << l;
    EXPECT_EQ(got[32 + l], l % 16 >= 3 ? l - 3 : l) << "up 3, width 16, lane " << l;
    EXPECT_EQ(got[64 + l], l + 5 < 32 ? l + 5 : l) << "down 5, lane " << l;
    // xor 9 in segments of 8: a later segment gives the lane its own value, an earlier one is read.
    EXPECT_EQ(got[96 + l], (l ^ 9) < (l & ~7) + 8 ? (l ^ 9) : l) << "xor 9, width 8, lane " << l;
    EXPECT_EQ(static_cast<unsigned>(got[128 + l]), ballot);
    EXPECT_EQ(got[160 + l], 3);
  }
}

// A 16x8 = (16x16)(16x8) product through mma.sync, each lane loading its fragments as the PTX ISA's figures for
// mma.m16n8k16 place them (g = lane / 4, t = lane % 4).
__global__ void mma_tile(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto pair = [](__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16;
  };
  const uint32_t af[4] = {pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  // b is 16x8 row-major: B[k][n] at b[k * 8 + n]; the fragment holds rows 2t, 2t+1 (and +8) of column g.
  const uint32_t b0 = pair(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  const uint32_t b1 = pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  float acc[4] = {1.0f, 2.0f, 3.0f, 4.0f};  // C, added
  yuan::gpu::mma_m16n8k16_bf16(acc, af, b0, b1);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

TEST(EmulatorInstructions, MmaM16n8k16Bf16) {
  const auto a = yuan::test::round_bf16(yuan::test::randn(16 * 16, 1.0f, 1));
  const auto b = yuan::test::round_bf16(yuan::test::randn(16 * 8, 1.0f, 2));
  yuan::test::DevArray<uint16_t> da(yuan::test::to_bf16(a)), db(yuan::test::to_bf16(b));
  yuan::test::DevArray<float> dd(16 * 8);
  launch(mma_tile, 1, 32, 0, 0, dd.get(), reinterpret_cast<const __nv_bfloat16*>(da.get()),
         reinterpret_cast<const __nv_bfloat16*>(db.get()));
  const auto got = dd.download();
  expect_no_report();
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      double ref = 1 + (i >= 8 ? 2 : 0) + j % 2;  // the C fragment values above, by position
      for (int k = 0; k < 16; k++) ref += static_cast<double>(a[i * 16 + k]) * b[k * 8 + j];
      EXPECT_NEAR(got[i * 8 + j], ref, 1e-5 * (1 + std::fabs(ref))) << i << "," << j;
    }
}

// Four 8x8 matrices, element (m, r, c) = 64 m + 8 r + c, in shared memory with a padded row stride; every lane
// gives the row address the instruction asks of it and keeps what it receives.
__global__ void ldmatrix_tiles(uint32_t* out, int trans) {
  __shared__ __align__(16) uint16_t s[4 * 8 * 16];  // rows of 16 elements: 8 used, 8 of padding
  for (int i = threadIdx.x; i < 4 * 8 * 16; i += 32) {
    const int m = i / 128, r = (i / 16) % 8, c = i % 16;
    s[i] = static_cast<uint16_t>(c < 8 ? 64 * m + 8 * r + c : 0xffff);
  }
  __syncthreads();
  const int lane = threadIdx.x;
  uint32_t r[4];
  const uint16_t* row = s + (lane / 8) * 128 + (lane % 8) * 16;
  if (trans)
    yuan::gpu::ldmatrix_x4_trans(r, row);
  else
    yuan::gpu::ldmatrix_x4(r, row);
  for (int m = 0; m < 4; m++) out[m * 32 + lane] = r[m];
}

TEST(EmulatorInstructions, LdmatrixX4AndTrans) {
  Exact<uint32_t> out(4 * 32);
  for (int trans : {0, 1}) {
    launch(ldmatrix_tiles, 1, 32, 0, 0, out.p, trans);
    expect_no_report();
    const std::vector<uint32_t> got = out.download(4 * 32);
    for (int m = 0; m < 4; m++)
      for (int l = 0; l < 32; l++) {
        const int a = l / 4, b = 2 * (l % 4);  // row a, columns b and b+1; transposed: column a, rows b and b+1
        const uint32_t lo = trans ? 64 * m + 8 * b + a : 64 * m + 8 * a + b;
        const uint32_t hi = trans ? 64 * m + 8 * (b + 1) + a : 64 * m + 8 * a + b + 1;
        EXPECT_EQ(got[m * 32 + l], lo | hi << 16) << (trans ? "trans " : "") << "matrix " << m << " lane " << l;
      }
  }
}

__global__ void count_atomically(int* total, float* sum) {
  __shared__ int n;
  if (threadIdx.x == 0) n = 0;
  __syncthreads();
  atomicAdd(&n, 1);
  atomicAdd(sum, 0.5f);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(total, n);
}

TEST(EmulatorInstructions, AtomicsDoNotRace) {
  Exact<int> total(1);
  Exact<float> sum(1);
  launch(count_atomically, 3, 256, 0, 0, total.p, sum.p);
  expect_no_report();
  EXPECT_EQ(total.download(1)[0], 3 * 256);
  EXPECT_EQ(sum.download(1)[0], 3 * 256 * 0.5f);
}

// cuda_bf16.h and cuda_fp16.h: round to nearest even, ties to even, canonical NaN, overflow to infinity.
TEST(EmulatorInstructions, Bf16AndHalfRounding) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const std::pair<uint32_t, uint16_t> bf16_cases[] = {
      {0x3f800000, 0x3f80}, {0x3f808000, 0x3f80} /* tie, even below */, {0x3f818000, 0x3f82} /* tie, odd */,
      {0x3f808001, 0x3f81}, {0x7f7fffff, 0x7f80} /* overflow */,      {0xff800000, 0xff80},
      {0x7fc00001, 0x7fff}, {0xffc00000, 0x7fff} /* NaN, either sign */, {0x00018000, 0x0002} /* subnormal tie */,
      {0x80000001, 0x8000}};
  for (const auto& [in, want] : bf16_cases)
    EXPECT_EQ(__bfloat16_as_ushort(__float2bfloat16(bits(in))), want) << std::hex << in;
  const std::pair<float, uint16_t> half_cases[] = {
      {65504.0f, 0x7bff},        {65519.0f, 0x7bff},          {65520.0f, 0x7c00} /* rounds to infinity */,
      {std::ldexp(1.0f, -24), 0x0001}, {std::ldexp(1.0f, -25), 0x0000} /* tie to even zero */,
      {std::ldexp(3.0f, -25), 0x0002} /* 1.5 ulp: tie to even */, {1.0f + std::ldexp(1.0f, -11), 0x3c00},
      {1.0f + std::ldexp(3.0f, -11), 0x3c02}, {-2.0f, 0xc000}, {NAN, 0x7fff}};
  for (const auto& [in, want] : half_cases) EXPECT_EQ(__half_as_ushort(__float2half(in)), want) << in;
  for (uint32_t h = 0; h < 0x10000; h++) {  // every half converts to float and back unchanged (NaNs canonicalised)
    const float f = __half2float(__ushort_as_half(static_cast<uint16_t>(h)));
    const uint16_t back = __half_as_ushort(__float2half(f));
    if (std::isnan(f))
      ASSERT_EQ(back, 0x7fff);
    else
      ASSERT_EQ(back, h) << std::hex << h;
  }
}

// ---- streams ----

__global__ void write_value(float* p, float v) { *p = v; }

// The stream mode for as long as it lives, then the one before.
struct Mode {
  explicit Mode(yuan::emu::StreamMode m) : saved(yuan::emu::stream_mode()) { yuan::emu::set_stream_mode(m); }
  ~Mode() { yuan::emu::set_stream_mode(saved); }
  yuan::emu::StreamMode saved;
};

constexpr yuan::emu::StreamMode kModes[] = {yuan::emu::StreamMode::Default, yuan::emu::StreamMode::Latest,
                                           yuan::emu::StreamMode::Earliest};

// The one report a planted stream race leaves: a StreamRace whose message says each of `says`.
void expect_stream_race(std::initializer_list<const char*> says) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 1u) << all(reps);
  EXPECT_EQ(reps[0].check, Check::StreamRace);
  for (const char* say : says) EXPECT_NE(reps[0].message.find(say), std::string::npos) << say << ": " << reps[0].message;
  expect_no_report();
}

// Work on a stream runs when the host needs it: a copy on another stream that does not wait for the kernel reads
// the old value (a GPU might or might not), and the happens-before rule reports the pair whatever the values; with
// the event it waits, the new one.
TEST(EmulatorStreams, AMissingWaitShows) {
  Mode mode(yuan::emu::StreamMode::Default);  // Earliest runs the kernel at its launch, before the copy
  Exact<float> d(1);
  float* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, sizeof(float)));
  cudaStream_t a, b;
  cudaEvent_t written;
  CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  launch(write_value, 1, 1, 0, a, d.p, 7.0f);
  CUDA_CHECK(cudaMemcpyAsync(pinned, d.p, sizeof(float), cudaMemcpyDeviceToHost, b));
  CUDA_CHECK(cudaStreamSynchronize(b));
  EXPECT_EQ(*pinned, 0.0f) << "no wait: the copy ran before the kernel";
  expect_stream_race({"kernel (anonymous namespace)::write_value on stream", "writes bytes 0 to 4 of the 4-byte device",
                      "which cudaMemcpyAsync (called from", "AMissingWaitShows"});
  launch(write_value, 1, 1, 0, a, d.p, 8.0f);
  CUDA_CHECK(cudaEventRecord(written, a));
  CUDA_CHECK(cudaStreamWaitEvent(b, written, 0));
  CUDA_CHECK(cudaMemcpyAsync(pinned, d.p, sizeof(float), cudaMemcpyDeviceToHost, b));
  CUDA_CHECK(cudaStreamSynchronize(b));
  EXPECT_EQ(*pinned, 8.0f) << "the wait orders the copy after the kernel";
  CUDA_CHECK(cudaEventDestroy(written));
  CUDA_CHECK(cudaStreamDestroy(a));
  CUDA_CHECK(cudaStreamDestroy(b));
  CUDA_CHECK(cudaFreeHost(pinned));
  expect_no_report();
}

// ---- libraries ----

struct Layouts {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Layouts() {
    cublasLtMatmulDescDestroy(desc);
    for (auto l : {a, b, c}) cublasLtMatrixLayoutDestroy(l);
  }
};

// D (m x n, column-major, f32) = A^T B for A stored k x m and B stored k x n, in two batches; against the host.
TEST(EmulatorLibraries, CublasLtReferenceGemmReadsTheDescriptors) {
  const int m = 5, n = 3, k = 7, lda = 9, ldb = 8, ldd = 6, batches = 2;
  const int64_t sa = lda * m + 3, sb = ldb * n, sd = ldd * n;  // batch strides in elements
  const auto a = yuan::test::round_bf16(yuan::test::randn(sa * batches, 1.0f, 3));
  const auto b = yuan::test::round_bf16(yuan::test::randn(sb * batches, 1.0f, 4));
  yuan::test::DevArray<uint16_t> da(yuan::test::to_bf16(a)), db(yuan::test::to_bf16(b));
  Exact<float> dd(sd * batches);
  cublasLtHandle_t h;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  Layouts l;
  cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const int32_t t = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatrixLayoutCreate(&l.a, CUDA_R_16BF, k, m, lda);
  cublasLtMatrixLayoutCreate(&l.b, CUDA_R_16BF, k, n, ldb);
  cublasLtMatrixLayoutCreate(&l.c, CUDA_R_32F, m, n, ldd);
  const int32_t count = batches;
  for (auto [layout, stride] : {std::pair{l.a, sa}, {l.b, sb}, {l.c, sd}}) {
    cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint32_t align = 4;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, l.desc, l.a, l.b, l.c, l.c, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  const float alpha = 2.0f, beta = 0.0f;
  ASSERT_EQ(cublasLtMatmul(h, l.desc, &alpha, da.get(), l.a, db.get(), l.b, &beta, dd.p, l.c, dd.p, l.c, &r.algo,
                           nullptr, 0, 0),
            CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = dd.download(sd * batches);
  expect_no_report();
  for (int p = 0; p < batches; p++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double ref = 0;
        for (int q = 0; q < k; q++) ref += static_cast<double>(a[p * sa + q + i * lda]) * b[p * sb + q + j * ldb];
        EXPECT_NEAR(got[p * sd + i + j * ldd], 2 * ref, 1e-5 * (1 + std::fabs(ref))) << p << ":" << i << "," << j;
      }

  // The algorithm belongs to its problem and its alignment; a leading dimension below the rows is refused.
  cublasLtMatrixLayout_t other;
  cublasLtMatrixLayoutCreate(&other, CUDA_R_32F, m, n, ldd + 1);
  cublasLtMatrixLayoutSetAttribute(other, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
  EXPECT_EQ(cublasLtMatmul(h, l.desc, &alpha, da.get(), l.a, db.get(), l.b, &beta, dd.p, other, dd.p, other, &r.algo,
                           nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(h, l.desc, &alpha, da.get() + 1, l.a, db.get(), l.b, &beta, dd.p, l.c, dd.p, l.c, &r.algo,
                           nullptr, 0, 0),
            CUBLAS_STATUS_INVALID_VALUE)
      << "A 2-byte aligned, the algorithm chosen for 4";
  cublasLtMatrixLayout_t short_ld;
  cublasLtMatrixLayoutCreate(&short_ld, CUDA_R_16BF, k, m, k - 1);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h, l.desc, short_ld, l.b, l.c, l.c, pref, 1, &r, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 3u) << all(reps);
  EXPECT_NE(reps[0].message.find("not chosen by the heuristic for this problem"), std::string::npos) << reps[0].message;
  EXPECT_NE(reps[1].message.find("2-byte aligned"), std::string::npos) << reps[1].message;
  EXPECT_NE(reps[2].message.find("leading dimension 6 below the 7 rows"), std::string::npos) << reps[2].message;
  for (auto x : {other, short_ld}) cublasLtMatrixLayoutDestroy(x);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtDestroy(h);
}

TEST(EmulatorLibraries, NcclRefusesWhatNcclWould) {
  ncclUniqueId id;
  ncclComm_t comm;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  std::vector<float> host(16);
  Exact<float> dev(16);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 16, ncclFloat32, ncclSum, comm, 0), ncclInvalidArgument)
      << "host buffers";
  EXPECT_EQ(ncclAllReduce(dev.p, dev.p, 17, ncclFloat32, ncclSum, comm, 0), ncclInvalidArgument) << "one too many";
  EXPECT_EQ(ncclAllReduce(dev.p, dev.p, 16, ncclFloat32, ncclSum, comm, 0), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  const std::vector<Report> reps = yuan::emu::take_reports();
  ASSERT_EQ(reps.size(), 2u) << all(reps);
  EXPECT_NE(reps[0].message.find("is not device memory"), std::string::npos) << reps[0].message;
  EXPECT_NE(reps[1].message.find("4 bytes past the end of a 64-byte device allocation"), std::string::npos)
      << reps[1].message;
}

// ---- stream modes (StreamMode): the three ordering bugs the default mode lets through ----

__global__ void copy_one(float* out, const float* in) { *out = *in; }

// Two non-blocking streams and a pinned float, released at the end of a test.
struct TwoStreams {
  cudaStream_t a = nullptr, b = nullptr;
  float* pinned = nullptr;
  TwoStreams() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMallocHost(&pinned, 2 * sizeof(float)));
  }
  ~TwoStreams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFreeHost(pinned);
  }
};

// An upload from pageable memory on the wrong stream (b, while the kernel that reads it is on a): the default mode
// completes it at the call, so the kernel reads it in time; Latest lands it when b is synchronised, after the kernel.
float upload_on_wrong_stream(yuan::emu::StreamMode m, bool wrong) {
  Mode mode(m);
  Exact<float> in(1), out(1);
  TwoStreams s;
  const float value = 5.0f;
  CUDA_CHECK(cudaMemcpyAsync(in.p, &value, sizeof value, cudaMemcpyHostToDevice, wrong ? s.b : s.a));
  launch(copy_one, 1, 1, 0, s.a, out.p, in.p);
  CUDA_CHECK(cudaMemcpyAsync(s.pinned, out.p, sizeof(float), cudaMemcpyDeviceToHost, s.a));
  cudaStreamSynchronize(s.a);  // on the wrong stream, the race is reported by now
  return *s.pinned;
}

// The timing modes see the wrong stream only where the timing shows it (Latest); the happens-before rule reports
// it in both.
TEST(EmulatorStreamModes, ACopyOnTheWrongStream) {
  using yuan::emu::StreamMode;
  for (StreamMode m : {StreamMode::Default, StreamMode::Latest}) {
    upload_on_wrong_stream(m, true);
    expect_stream_race({"kernel (anonymous namespace)::copy_one", "cudaMemcpyAsync (called from",
                        "upload_on_wrong_stream"});
  }
  EXPECT_EQ(upload_on_wrong_stream(StreamMode::Latest, false), 5.0f) << "on the kernel's stream it is in order";
  expect_no_report();
}

// The host reads a download's pinned destination before synchronising: under Latest it holds the NaN pattern of
// fresh device memory until the copy completes (a host write to it before then is a race in every mode:
// EmulatorHappensBefore.AHostWriteOfAPinnedBufferBeforeItsCopyIsSynchronised).
TEST(EmulatorStreamModes, AHostReadOfADownloadWithoutASynchronise) {
  Mode mode(yuan::emu::StreamMode::Latest);
  Exact<float> d(1);
  TwoStreams s;
  *s.pinned = 3.0f;
  launch(write_value, 1, 1, 0, s.a, d.p, 7.0f);
  CUDA_CHECK(cudaMemcpyAsync(s.pinned, d.p, sizeof(float), cudaMemcpyDeviceToHost, s.a));
  EXPECT_TRUE(std::isnan(*s.pinned)) << "read before the synchronise: " << *s.pinned;
  CUDA_CHECK(cudaStreamSynchronize(s.a));
  EXPECT_EQ(*s.pinned, 7.0f);
  expect_no_report();
}

// Earliest: an upload enqueued before the host filled its pinned source copies what was there at the enqueue,
// which the default mode (running it at the synchronise) hides. The host's write is a race in both, and reported
// in both (EmulatorHappensBefore.AHostWriteOfAPinnedBufferBeforeItsCopyIsSynchronised).
float fill_after_enqueue(yuan::emu::StreamMode m) {
  Mode mode(m);
  Exact<float> d(1);
  TwoStreams s;
  s.pinned[0] = 0.0f;
  CUDA_CHECK(cudaMemcpyAsync(d.p, s.pinned, sizeof(float), cudaMemcpyHostToDevice, s.a));
  s.pinned[0] = 4.0f;
  CUDA_CHECK(cudaMemcpyAsync(s.pinned + 1, d.p, sizeof(float), cudaMemcpyDeviceToHost, s.a));
  cudaStreamSynchronize(s.a);  // runs both copies, then finds the host's write
  return s.pinned[1];
}

TEST(EmulatorStreamModes, EarliestRunsAtTheEnqueue) {
  using yuan::emu::StreamMode;
  EXPECT_EQ(fill_after_enqueue(StreamMode::Default), 4.0f) << "what the default mode's timing lets through";
  expect_stream_race({"the host wrote", "pinned source", "fill_after_enqueue"});
  EXPECT_EQ(fill_after_enqueue(StreamMode::Earliest), 0.0f);
  expect_stream_race({"the host wrote", "pinned source", "fill_after_enqueue"});
}

// ---- happens-before (Check::StreamRace): a missing wait between streams, whatever the timing ----

// Each planted race runs in every stream mode (they run the work at different times, the report must not depend on
// it), once with the wait, which must raise nothing, and once without, which must raise one StreamRace naming both
// operations, a stream of each and the buffer.
// `plant(wait)` does the work; the one report it leaves without the wait must contain each of `says`.
template <typename F>
void expect_race_only_without_wait(F plant, std::initializer_list<const char*> says) {
  for (yuan::emu::StreamMode m : kModes) {
    SCOPED_TRACE(static_cast<int>(m));
    Mode mode(m);
    plant(true);
    expect_no_report();
    plant(false);
    expect_stream_race(says);
  }
}

// A gradient reduced over NCCL on the communication stream, then downloaded on the copy stream (to the host's
// optimizer): the download must wait for the reduction's event. In the default mode NCCL runs at its enqueue and
// Latest synchronises first, so only Earliest used to show it, as a wrong value.
void download_after_reduce(bool wait, bool scatter) {
  ncclUniqueId id;
  ncclComm_t comm;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  Exact<float> grad(64), reduced(64);
  TwoStreams s;  // a: NCCL's stream, b: the copies'
  cudaEvent_t done;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  if (scatter)
    ASSERT_EQ(ncclReduceScatter(grad.p, reduced.p, 64, ncclFloat32, ncclSum, comm, s.a), ncclSuccess);
  else
    ASSERT_EQ(ncclAllReduce(grad.p, reduced.p, 64, ncclFloat32, ncclSum, comm, s.a), ncclSuccess);
  cudaEventRecord(done, s.a);
  if (wait) cudaStreamWaitEvent(s.b, done, 0);
  cudaMemcpyAsync(s.pinned, reduced.p + 8, sizeof(float), cudaMemcpyDeviceToHost, s.b);
  cudaStreamSynchronize(s.b);
  cudaDeviceSynchronize();
  cudaEventDestroy(done);
  ncclCommDestroy(comm);
}

TEST(EmulatorHappensBefore, ADownloadThatDoesNotWaitForTheReduction) {
  expect_race_only_without_wait([](bool wait) { download_after_reduce(wait, false); },
                                {"ncclAllReduce (called from", "cudaMemcpyAsync (called from", "download_after_reduce",
                                 "stream ", "of the 256-byte device allocation at"});
  expect_race_only_without_wait([](bool wait) { download_after_reduce(wait, true); },
                                {"ncclReduceScatter (called from", "cudaMemcpyAsync (called from", "bytes 32 to 36"});
}

// Parameters set on one stream (an upload of new values, a kernel writing them) while a kernel on another reads
// them: the compute stream must wait for the event of the update.
void read_while_set(bool wait, bool by_kernel) {
  Exact<float> params(4), out(1);
  TwoStreams s;  // a: sets the parameters, b: computes with them
  cudaEvent_t set;
  CUDA_CHECK(cudaEventCreateWithFlags(&set, cudaEventDisableTiming));
  s.pinned[0] = 6.0f;
  if (by_kernel)
    launch(write_value, 1, 1, 0, s.a, params.p + 2, 6.0f);
  else
    CUDA_CHECK(cudaMemcpyAsync(params.p + 2, s.pinned, sizeof(float), cudaMemcpyHostToDevice, s.a));
  cudaEventRecord(set, s.a);
  if (wait) cudaStreamWaitEvent(s.b, set, 0);
  try {
    launch(copy_one, 1, 1, 0, s.b, out.p, params.p + 2);
  } catch (const std::exception&) {  // Earliest runs the kernel at its launch, whose check throws on the report
  }
  cudaDeviceSynchronize();
  cudaEventDestroy(set);
}

TEST(EmulatorHappensBefore, ParametersSetOnOneStreamWhileAKernelOnAnotherReadsThem) {
  expect_race_only_without_wait([](bool wait) { read_while_set(wait, false); },
                                {"kernel (anonymous namespace)::copy_one", "cudaMemcpyAsync (called from", "read_while_set",
                                 "bytes 8 to 12 of the 16-byte device allocation"});
  expect_race_only_without_wait([](bool wait) { read_while_set(wait, true); },
                                {"kernel (anonymous namespace)::copy_one", "kernel (anonymous namespace)::write_value",
                                 "bytes 8 to 12"});
}

// A pinned staging buffer: a chunk goes up from it on one stream, and the next chunk comes down into it on the
// other before the event of the upload: the download may overwrite what the upload has not read yet. `swap` trades
// the streams, so that a synchronise of the device runs the download first as well as second.
void refill_staging(bool wait, bool swap) {
  Exact<float> up(1), down(1);
  TwoStreams s;
  cudaStream_t first = swap ? s.b : s.a, second = swap ? s.a : s.b;
  cudaEvent_t read;
  CUDA_CHECK(cudaEventCreateWithFlags(&read, cudaEventDisableTiming));
  s.pinned[0] = 1.0f;
  cudaMemcpyAsync(up.p, s.pinned, sizeof(float), cudaMemcpyHostToDevice, first);
  cudaEventRecord(read, first);
  if (wait) cudaStreamWaitEvent(second, read, 0);
  cudaMemcpyAsync(s.pinned, down.p, sizeof(float), cudaMemcpyDeviceToHost, second);
  cudaDeviceSynchronize();
  cudaEventDestroy(read);
}

TEST(EmulatorHappensBefore, AStagingBufferRefilledBeforeTheEventOfItsCopy) {
  for (bool swap : {false, true})
    expect_race_only_without_wait([swap](bool wait) { refill_staging(wait, swap); },
                                  {"cudaMemcpyAsync (called from", "refill_staging",
                                   "of the 8-byte pinned host allocation", "no event wait or synchronisation"});
}

// The host's own writes of pinned memory: a staging buffer refilled for the next chunk before the host
// synchronised with the upload that reads it (the event of the upload, as the offload pipeline's lanes wait for),
// or a download's destination written before the host synchronised with the download, before or after the copy
// ran. Whether the copy had run by then is timing; the write is a race in every mode.
enum class HostWrite { UploadSource, DownloadDestination, DownloadDestinationAfterItRan };

void host_writes_pinned(bool wait, HostWrite kind) {
  Exact<float> d(1);
  TwoStreams s;
  cudaEvent_t done;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  s.pinned[0] = 1.0f;
  s.pinned[1] = 9.0f;  // beside the buffer, in the same allocation and page: the host may write it at any time
  if (kind == HostWrite::UploadSource) {
    cudaMemcpyAsync(d.p, s.pinned, sizeof(float), cudaMemcpyHostToDevice, s.a);
  } else {
    launch(write_value, 1, 1, 0, s.a, d.p, 7.0f);
    cudaMemcpyAsync(s.pinned, d.p, sizeof(float), cudaMemcpyDeviceToHost, s.a);
    if (kind == HostWrite::DownloadDestinationAfterItRan) cudaStreamQuery(s.b);  // no synchronisation with a
  }
  cudaEventRecord(done, s.a);
  s.pinned[1] = 8.0f;
  if (wait) cudaEventSynchronize(done);
  s.pinned[0] = 2.0f;
  cudaStreamSynchronize(s.a);
  cudaEventDestroy(done);
}

TEST(EmulatorHappensBefore, AHostWriteOfAPinnedBufferBeforeItsCopyIsSynchronised) {
  expect_race_only_without_wait([](bool wait) { host_writes_pinned(wait, HostWrite::UploadSource); },
                                {"the host wrote byte", "pinned source", "of the 8-byte allocation",
                                 "cudaMemcpyAsync called from", "host_writes_pinned", "which reads it"});
  expect_race_only_without_wait([](bool wait) { host_writes_pinned(wait, HostWrite::DownloadDestination); },
                                {"the host wrote byte", "pinned destination", "which writes it"});
  expect_race_only_without_wait(
      [](bool wait) { host_writes_pinned(wait, HostWrite::DownloadDestinationAfterItRan); },
      {"the host wrote byte", "pinned destination", "host_writes_pinned"});
}

// What orders work besides an event wait: the legacy stream's implicit synchronisation with blocking streams, a
// host synchronise before the next enqueue, the same stream. None of it is a race.
TEST(EmulatorHappensBefore, ImplicitAndHostOrderIsNoRace) {
  for (yuan::emu::StreamMode m : kModes) {
    Mode mode(m);
    Exact<float> d(1), out(1);
    cudaStream_t blocking, other;
    CUDA_CHECK(cudaStreamCreate(&blocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    launch(write_value, 1, 1, 0, blocking, d.p, 1.0f);
    launch(copy_one, 1, 1, 0, nullptr, out.p, d.p);  // the legacy stream waits for the blocking stream
    launch(write_value, 1, 1, 0, blocking, d.p, 2.0f);  // and the blocking stream for it
    CUDA_CHECK(cudaStreamSynchronize(blocking));
    launch(copy_one, 1, 1, 0, other, out.p, d.p);  // after the host synchronised with the writer
    launch(write_value, 1, 1, 0, other, out.p, 3.0f);
    CUDA_CHECK(cudaStreamDestroy(blocking));
    CUDA_CHECK(cudaStreamDestroy(other));
    expect_no_report();
  }
}


// ---- shapes and tolerances: bugs that only some shapes, paths or sizes of numbers reach ----

// Column sums of an N x C bf16 matrix, one column a thread, kSumColumns columns a block and the columns past them
// in the grid's second dimension. `block_stride` is where block y's columns begin: kSumColumns is right; the planted
// bug, half that (the block size the kernel once had), makes block 1 redo columns of block 0 and drop the last
// ones, which no width up to 512 reaches.
constexpr int kSumColumns = 512;

__global__ void column_sums(float* sums, const __nv_bfloat16* in, int N, int C, int block_stride) {
  const int c = blockIdx.y * block_stride + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int n = 0; n < N; n++) s += __bfloat162float(in[static_cast<size_t>(n) * C + c]);
  sums[c] = s;
}

void launch_column_sums(float* sums, const __nv_bfloat16* in, int N, int C, int block_stride) {
  launch(column_sums, dim3(1, (C + kSumColumns - 1) / kSumColumns), kSumColumns, 0, 0, sums, in, N, C, block_stride);
}

__nv_bfloat16* bf16_of(yuan::test::DevArray<uint16_t>& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); }

// The widths of a sweep (none a multiple of the block but 512, two above it) at which column_sums with
// `block_stride` failed a check, each failure a device-memory race.
std::vector<int> widths_reported(int block_stride) {
  std::vector<int> reported;
  for (int C : {8, 100, 511, 512, 584, 1000}) {
    yuan::test::DevArray<uint16_t> in(yuan::test::to_bf16(yuan::test::randn(3 * C, 1.0f, C)));
    Exact<float> sums(C);
    launch_column_sums(sums.p, bf16_of(in), 3, C, block_stride);
    if (cudaDeviceSynchronize() != cudaSuccess) reported.push_back(C);
    for (const Report& r : yuan::emu::take_reports()) EXPECT_EQ(r.check, Check::GlobalRace) << r.message;
  }
  return reported;
}

TEST_F(EmulatorChecks, ASecondGridDimensionOnlyWidthsAbove512Reach) {
  EXPECT_EQ(widths_reported(kSumColumns), std::vector<int>{});
  EXPECT_EQ(widths_reported(kSumColumns / 2), (std::vector<int>{584, 1000}));
  const int C = 584;
  yuan::test::DevArray<uint16_t> in(yuan::test::to_bf16(yuan::test::randn(3 * C, 1.0f, C)));
  Exact<float> sums(C);
  launch_column_sums(sums.p, bf16_of(in), 3, C, kSumColumns / 2);
  expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "column_sums", {0, 1, 0}, {0, 0, 0}, sums.p + 256,
                "which thread (256,0,0) of block (0,0,0) wrote in this launch");
}

// A GELU-like kernel over 16-byte packs, one pack a thread. The planted bug (`overrun`): the thread after the last
// pack reads and writes one pack past the end, which the 16 bytes of initialised slack the tests' arrays once had
// hid; DevArray has none, so it is an OutOfBounds.
__global__ void double_packs(__nv_bfloat16* out, const __nv_bfloat16* in, size_t n, bool overrun) {
  const size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * yuan::gpu::PackBf16::kN;
  if (overrun ? i > n : i >= n) return;
  const yuan::gpu::PackBf16 x = yuan::gpu::load_pack(in + i);
  yuan::gpu::PackBf16 y;
  for (int k = 0; k < yuan::gpu::PackBf16::kN; k++) y.v[k] = __float2bfloat16(2.0f * __bfloat162float(x.v[k]));
  yuan::gpu::store_pack(out + i, y);
}

TEST_F(EmulatorChecks, APackPastTheEndOfATestArray) {
  const size_t n = 37 * yuan::gpu::PackBf16::kN;
  Exact<__nv_bfloat16> in_slack(n + 8), out_slack(n + 8);
  launch(double_packs, 1, 64, 0, 0, out_slack.p, in_slack.p, n, true);
  expect_no_report();  // what the slack hid
  yuan::test::DevArray<uint16_t> in(n), out(n);
  launch(double_packs, 1, 64, 0, 0, bf16_of(out), bf16_of(in), n, false);
  expect_no_report();
  launch(double_packs, 1, 64, 0, 0, bf16_of(out), bf16_of(in), n, true);
  expect_report(cudaErrorIllegalAddress, Check::OutOfBounds, "double_packs", {0, 0, 0}, {37, 0, 0}, bf16_of(in) + n,
                "0 bytes past the end of a 592-byte allocation");
}

// A linear layer's weight and bias gradients as a backend takes them (dw = inp^T dout, dbias = dout's column
// sums; inp N x C, dout N x OC, row-major): the bias gradient fused into the GEMM (cuBLASLt's BGRADB epilogue)
// when the library has an algorithm for it, else the plain GEMM and column_sums with `fallback_stride`. On a GPU the
// library may refuse the epilogue for some shapes; the emulated one refuses it only when told to.
void weight_and_bias_gradients(float* dw, float* dbias, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int N,
                               int C, int OC, int fallback_stride) {
  cublasLtHandle_t h;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  Layouts l;
  cublasLtMatrixLayoutCreate(&l.a, CUDA_R_16BF, C, N, C);
  cublasLtMatrixLayoutCreate(&l.b, CUDA_R_16BF, OC, N, OC);
  cublasLtMatrixLayoutCreate(&l.c, CUDA_R_32F, C, OC, C);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  bool fused = false;
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BGRADB, CUBLASLT_EPILOGUE_DEFAULT}) {
    cublasLtMatmulDescDestroy(l.desc);
    cublasLtMatmulDescCreate(&l.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const int32_t t = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    if (e == CUBLASLT_EPILOGUE_BGRADB)
      cublasLtMatmulDescSetAttribute(l.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias);
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, l.desc, l.a, l.b, l.c, l.c, pref, 1, &r, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) continue;  // no algorithm: the fallback
    ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(found, 1);
    const float alpha = 1.0f, beta = 0.0f;
    ASSERT_EQ(cublasLtMatmul(h, l.desc, &alpha, inp, l.a, dout, l.b, &beta, dw, l.c, dw, l.c, &r.algo, nullptr, 0, 0),
              CUBLAS_STATUS_SUCCESS);
    fused = e == CUBLASLT_EPILOGUE_BGRADB;
    break;
  }
  if (!fused) launch_column_sums(dbias, dout, N, OC, fallback_stride);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtDestroy(h);
}

// The planted bug of the sweep above, now in the fallback of a fused epilogue at a width above 512: with the
// library offering the epilogue it never runs; refusing it (set_cublaslt_refuses_fused_epilogues, as CudaMatmul's
// Refused cases do) runs the fallback, and the bug is reported.
TEST_F(EmulatorChecks, AFallbackOnlyARefusedEpilogueReaches) {
  const int N = 5, C = 16, OC = 584;
  const auto inp = yuan::test::randn(N * C, 1.0f, 60), dout = yuan::test::randn(N * OC, 1.0f, 61);
  yuan::test::DevArray<uint16_t> d_inp(yuan::test::to_bf16(inp)), d_dout(yuan::test::to_bf16(dout));
  std::vector<float> want(OC, 0.0f);
  const auto rounded = yuan::test::round_bf16(dout);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < OC; c++) want[c] += rounded[static_cast<size_t>(n) * OC + c];
  for (bool refuse : {false, true}) {
    yuan::emu::set_cublaslt_refuses_fused_epilogues(refuse);
    for (int stride : {kSumColumns, kSumColumns / 2}) {
      yuan::test::DevArray<float> dw(C * OC), dbias(OC);
      weight_and_bias_gradients(dw.get(), dbias.get(), bf16_of(d_inp), bf16_of(d_dout), N, C, OC, stride);
      if (refuse && stride != kSumColumns) {
        expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "column_sums", {0, 1, 0}, {0, 0, 0},
                      dbias.get() + 256, "which thread (256,0,0) of block (0,0,0) wrote in this launch");
        continue;
      }
      expect_no_report();
      EXPECT_LT(yuan::test::rel_err(dbias.download(), want), 1e-5) << "refused " << refuse << ", stride " << stride;
    }
  }
  yuan::emu::set_cublaslt_refuses_fused_epilogues(false);
}

// The vocabulary-parallel cross-entropy (classifier.cuh's three passes) over the tensor ranks' `parts` of a
// vocabulary, on B x T rows of logits of mean `mean` and spread 2, the all-reduces done on the host: the maxima
// with `reduce_max`, the sums with +. Returned: the largest relative error of the losses against the whole row's
// (CudaClassifier.VocabularyParallelMatchesCpu holds it to 1e-4).
double vocab_parallel_loss_error(const std::vector<int>& parts, float mean, float (*reduce_max)(float, float)) {
  using namespace yuan::test;
  const int B = 2, T = 5, N = B * T, stride = T + 1;
  int V = 0;
  for (int v : parts) V += v;
  const auto z = round_bf16(randn(static_cast<size_t>(N) * V, 2.0f, 90 + V, mean));
  std::vector<int32_t> tok(static_cast<size_t>(B) * stride);
  std::mt19937 gen(91);
  for (auto& t : tok) t = static_cast<int32_t>(gen() % V);
  std::vector<float> whole = z, want(N);
  yuan::ops::classifier_forward_backward(whole.data(), want.data(), tok.data() + 1, B, T, V, stride, 0.0f);
  DevArray<int32_t> d_tok(tok);
  std::vector<std::unique_ptr<DevArray<uint16_t>>> d_part;
  std::vector<float> row_max(N), sums(2 * static_cast<size_t>(N), 0.0f);
  const auto part_ld = [](int v) { return (v + 63) / 64 * 64; };
  for (size_t r = 0, b = 0; r < parts.size(); b += parts[r], r++) {
    const int v = parts[r], ld = part_ld(v);
    std::vector<float> padded(static_cast<size_t>(N) * ld, mean);
    for (int i = 0; i < N; i++) std::copy_n(z.begin() + static_cast<size_t>(i) * V + b, v, padded.begin() + i * ld);
    d_part.push_back(std::make_unique<DevArray<uint16_t>>(to_bf16(padded)));
    DevArray<float> d_max(N);
    yuan::gpu::classifier_row_max(bf16_of(*d_part[r]), d_max.get(), N, v, ld, 0);
    const auto got = d_max.download();
    for (int i = 0; i < N; i++) row_max[i] = r == 0 ? got[i] : reduce_max(row_max[i], got[i]);
  }
  DevArray<float> d_row_max(row_max);
  for (size_t r = 0, b = 0; r < parts.size(); b += parts[r], r++) {
    DevArray<float> d_sums(sums.size());
    yuan::gpu::classifier_row_sums(bf16_of(*d_part[r]), d_row_max.get(), d_tok.get() + 1, B, T, parts[r],
                                   part_ld(parts[r]), stride, static_cast<int>(b), d_sums.get(), 0);
    const auto got = d_sums.download();
    for (size_t i = 0; i < sums.size(); i++) sums[i] += got[i];
  }
  DevArray<float> d_sums(sums), d_losses(N);
  yuan::gpu::classifier_parallel_finish(bf16_of(*d_part[0]), d_losses.get(), d_row_max.get(), d_sums.get(),
                                        d_tok.get() + 1, B, T, parts[0], part_ld(parts[0]), stride, 0, 0.0f, 0);
  return rel_err(d_losses.download(), want);
}

// A sum where the maximum's all-reduce belongs: softmax and loss do not change when every logit of a row shifts
// by the same amount, so over 2 ranks with logits near 1 (the maxima summed: a shift of a few units) the losses
// are right; over 4 ranks with logits near 30, as a trained model's are, exp(z - max) underflows and they are not.
TEST(EmulatorShapes, ASumForTheMaximumShowsOverFourRanksWithLargeLogits) {
  float (*const maximum)(float, float) = [](float a, float b) { return std::max(a, b); };
  float (*const sum)(float, float) = [](float a, float b) { return a + b; };
  const std::vector<int> two = {200, 201}, four = {96, 101, 64, 139};
  EXPECT_LT(vocab_parallel_loss_error(two, 1.0f, maximum), 1e-4);
  EXPECT_LT(vocab_parallel_loss_error(four, 30.0f, maximum), 1e-4);
  EXPECT_LT(vocab_parallel_loss_error(two, 1.0f, sum), 1e-4) << "what 2 ranks and small logits let through";
  EXPECT_GT(vocab_parallel_loss_error(four, 30.0f, sum), 1e-4) << "caught at 4 ranks with large logits";
  expect_no_report();
}

}  // namespace

// Named outside the anonymous namespace, so that a test can spell its mangled name in a ptxas table.
namespace traffic_probe {
__global__ void occupancy_probe(float* out) { out[threadIdx.x] = 1.0f; }
}  // namespace traffic_probe

namespace {

// ---- traffic (docs/EMULATOR.md, "Traffic") ----

// Launches `kernel` as gpu::launch does, asking for its traffic, and waits for it. The schedule is the default one
// (varied orders, threads switched at random accesses): what is counted must not depend on it.
template <typename... P, typename... A>
yuan::emu::Traffic counted(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  using Call = yuan::gpu::detail::KernelCall<P...>;
  auto call = std::make_shared<const Call>(Call{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
  yuan::emu::Traffic t;
  const yuan::emu::Launch l{reinterpret_cast<const void*>(kernel), grid, block, smem, 0, &t};
  EXPECT_EQ(yuan::emu::launch(l, call, sizeof(Call), &Call::run), cudaSuccess);
  expect_no_report();
  return t;
}

bool finds(const yuan::emu::Traffic& t, const std::string& kind, const std::string& where) {
  for (const std::string& f : t.findings)
    if (f.compare(0, kind.size(), kind) == 0 && f.find(where) != std::string::npos) return true;
  return false;
}

std::string findings_of(const yuan::emu::Traffic& t) {
  std::string s;
  for (const std::string& f : t.findings) s += "\n  " + f;
  return s;
}

__global__ void copy_packs(__nv_bfloat16* out, const __nv_bfloat16* in) {
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * yuan::gpu::PackBf16::kN;
  yuan::gpu::store_pack(out + i, yuan::gpu::load_pack(in + i));
}

// Each warp's pack load and store are one request of 16 sectors each, every byte of which it uses: the ideal.
TEST(EmulatorTraffic, ACoalescedCopyMovesWhatItTouches) {
  const int blocks = 3, threads = 256, n = blocks * threads * yuan::gpu::PackBf16::kN;
  Exact<__nv_bfloat16> in(n), out(n);
  const yuan::emu::Traffic t = counted(copy_packs, blocks, threads, 0, out.p, in.p);
  const uint64_t bytes = n * sizeof(__nv_bfloat16);
  EXPECT_EQ(t.read_bytes, bytes);
  EXPECT_EQ(t.written_bytes, bytes);
  EXPECT_EQ(t.touched_bytes(), 2 * bytes);
  EXPECT_EQ(t.requests, 2u * blocks * threads / 32);
  EXPECT_EQ(t.sectors, 2 * bytes / 32);
  EXPECT_EQ(t.used_bytes, 2 * bytes);
  EXPECT_EQ(t.sector_efficiency(), 1.0);
  EXPECT_EQ(t.shared_requests, 0u);
  EXPECT_TRUE(t.findings.empty()) << findings_of(t);
}

// The planted waste: lane i reads element i * stride, so each of a warp's 2-byte loads fetches a sector of its own.
__global__ void strided_copy(__nv_bfloat16* out, const __nv_bfloat16* in, int stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i * stride];
}

TEST(EmulatorTraffic, AStridedLoadIsUncoalesced) {
  const int threads = 128, stride = 64;
  Exact<__nv_bfloat16> in(threads * stride), out(threads);
  const yuan::emu::Traffic t = counted(strided_copy, 1, threads, 0, out.p, in.p, stride);
  EXPECT_EQ(t.read_bytes, threads * 2u);
  EXPECT_EQ(t.requests, 2u * threads / 32);
  EXPECT_EQ(t.sectors, (32u + 2u) * threads / 32);  // the load: 32 sectors per warp; the store: 2
  EXPECT_LT(t.sector_efficiency(), 0.2);
  EXPECT_TRUE(finds(t, "uncoalesced: ", "strided_copy+0x")) << findings_of(t);
  EXPECT_NE(findings_of(t).find("32.0 sectors for 64.0 bytes used per request (efficiency 0.06)"), std::string::npos)
      << findings_of(t);
  EXPECT_FALSE(finds(t, "re-read", "")) << findings_of(t);
}

// A row's variance in two passes, the mean first and then the squared deviations: the second pass reads the row
// again, where a thread could have kept its 8 values in registers (or summed x and x^2 in one pass).
__global__ void row_variance_two_passes(float* var, const float* in, int C) {
  const float* row = in + blockIdx.x * C;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += 32) sum += row[c];
  const float mean = yuan::gpu::warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = threadIdx.x; c < C; c += 32) sq += (row[c] - mean) * (row[c] - mean);
  sq = yuan::gpu::warp_sum(sq);
  if (threadIdx.x == 0) var[blockIdx.x] = sq / C;
}

TEST(EmulatorTraffic, ASecondPassRereads) {
  const int rows = 4, C = 256;
  Exact<float> in(rows * C), var(rows);
  const yuan::emu::Traffic t = counted(row_variance_two_passes, rows, 32, 0, var.p, in.p, C);
  EXPECT_EQ(t.read_bytes, rows * C * 4u);
  EXPECT_EQ(t.written_bytes, rows * 4u);
  const double fetched = 32.0 * t.sectors / t.touched_bytes();
  EXPECT_GT(fetched, 1.9);
  EXPECT_LT(fetched, 2.1);
  EXPECT_TRUE(finds(t, "re-read: the launch fetched 2.0x the bytes it touched", "")) << findings_of(t);
  EXPECT_FALSE(finds(t, "uncoalesced", "")) << findings_of(t);
}

// The classic 32x32 float transpose through shared memory: written by rows, read by columns. Without padding a
// column is 32 words of one bank (32 wavefronts a request); with one word of padding per row, of 32 banks.
template <int Pad>
__global__ void transpose_tile(float* out, const float* in) {
  __shared__ float tile[32][32 + Pad];
  const int x = threadIdx.x, y = threadIdx.y;
  tile[y][x] = in[y * 32 + x];
  __syncthreads();
  out[y * 32 + x] = tile[x][y];
}

TEST(EmulatorTraffic, AColumnOfAnUnpaddedTileConflicts) {
  Exact<float> in(32 * 32), out(32 * 32);
  const yuan::emu::Traffic t = counted(transpose_tile<0>, 1, dim3(32, 32), 0, out.p, in.p);
  EXPECT_EQ(t.shared_requests, 2u * 32);      // each warp's row write and column read
  EXPECT_EQ(t.bank_conflicts, 31u * 32);      // the reads': 32 wavefronts where 1 would do
  EXPECT_TRUE(finds(t, "bank conflicts: ", "transpose_tile<0>+0x")) << findings_of(t);
  EXPECT_NE(findings_of(t).find("32.0 wavefronts per request (1.0 ideal)"), std::string::npos) << findings_of(t);
  EXPECT_EQ(t.sector_efficiency(), 1.0);

  const yuan::emu::Traffic padded = counted(transpose_tile<1>, 1, dim3(32, 32), 0, out.p, in.p);
  EXPECT_EQ(padded.shared_requests, 2u * 32);
  EXPECT_EQ(padded.bank_conflicts, 0u);
  EXPECT_TRUE(padded.findings.empty()) << findings_of(padded);
}

// ldmatrix reads 16 bytes a lane, 8 lanes (one matrix) a phase: rows 16 bytes apart take one wavefront a matrix,
// rows 128 bytes apart sit in the same 4 banks and take 8.
template <int RowBytes>
__global__ void ldmatrix_rows(uint32_t* out) {
  __shared__ uint32_t tile[32 * RowBytes / 4];
  for (int i = threadIdx.x; i < 32 * RowBytes / 4; i += 32) tile[i] = i;
  __syncthreads();
  uint32_t r[4];
  yuan::gpu::ldmatrix_x4(r, reinterpret_cast<const unsigned char*>(tile) + threadIdx.x * RowBytes);
  out[threadIdx.x] = r[0] ^ r[1] ^ r[2] ^ r[3];
}

TEST(EmulatorTraffic, LdmatrixRowsInTheSameBanksConflict) {
  Exact<uint32_t> out(32);
  const yuan::emu::Traffic dense = counted(ldmatrix_rows<16>, 1, 32, 0, out.p);
  EXPECT_EQ(dense.shared_requests, 16u / 4 + 1);  // the fill's writes, one ldmatrix
  EXPECT_EQ(dense.bank_conflicts, 0u);
  const yuan::emu::Traffic apart = counted(ldmatrix_rows<128>, 1, 32, 0, out.p);
  EXPECT_EQ(apart.shared_requests, 128u / 4 + 1);
  EXPECT_EQ(apart.bank_conflicts, 4u * (8 - 1));
  EXPECT_TRUE(finds(apart, "bank conflicts: ", "ldmatrix_rows<128>+0x")) << findings_of(apart);
}

// A launch that used atomics runs twice (the varied schedule's second order); its traffic is its first run's.
__global__ void sum_packs(float* total, const float* in) {
  const yuan::gpu::PackF32 x = yuan::gpu::load_pack(in + 4 * (blockIdx.x * blockDim.x + threadIdx.x));
  atomicAdd(total, x.v[0] + x.v[1] + x.v[2] + x.v[3]);
}

TEST(EmulatorTraffic, AnAtomicLaunchCountsItsFirstRun) {
  const int blocks = 2, threads = 64;
  Exact<float> in(blocks * threads * 4), total(1);
  const yuan::emu::Traffic t = counted(sum_packs, blocks, threads, 0, total.p, in.p);
  EXPECT_EQ(t.read_bytes, blocks * threads * 16u + 4u);  // the packs, and the total the first atomic reads
  EXPECT_EQ(t.written_bytes, 4u);
  EXPECT_EQ(t.requests, 2u * blocks * threads / 32);  // a pack load and an atomic per warp, once
}

// Occupancy from a ptxas table the test writes: the probe's registers and static shared memory as ptxas would
// report them, with the launch's block and dynamic shared memory.
TEST(EmulatorTraffic, OccupancyFromPtxasReport) {
  const std::string path = ::testing::TempDir() + "emulator_ptxas.txt";
  Exact<float> out(1024);
  auto occupancy = [&](int registers, int static_shared, unsigned threads, size_t dynamic_shared) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fprintf(f, "_ZN12other_kernel1fEv 255 0 0 0\n_ZN13traffic_probe15occupancy_probeEPf %d %d 0 0\n",
                 registers, static_shared);
    std::fclose(f);
    yuan::emu::set_ptxas_table(path);
    const yuan::emu::Traffic t =
        counted(traffic_probe::occupancy_probe, 1, threads, dynamic_shared, out.p);
    EXPECT_EQ(t.registers, registers);
    return t.occupancy;
  };
  EXPECT_EQ(occupancy(32, 0, 256, 0), 1.0);       // 8 blocks of 8 warps: the SM's 64
  EXPECT_EQ(occupancy(128, 0, 256, 0), 0.25);     // 4096 registers a warp: 16 warps
  EXPECT_EQ(occupancy(64, 0, 1024, 0), 0.5);      // one block of 32 warps
  EXPECT_EQ(occupancy(33, 0, 256, 0), 0.75);      // 33 registers allocate as 40: 6 blocks
  EXPECT_EQ(occupancy(32, 100 << 10, 256, 0), 0.25);  // 101 KiB a block with the reserved 1 KiB: 2 blocks
  ASSERT_EQ(cudaFuncSetAttribute(traffic_probe::occupancy_probe, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 100 << 10),
            cudaSuccess);
  EXPECT_EQ(occupancy(32, 0, 256, 100 << 10), 0.25);  // dynamic shared memory counts the same
  EXPECT_EQ(occupancy(32, 0, 32, 0), 0.5);        // 32 blocks of 1 warp: the block limit

  yuan::emu::set_ptxas_table(path + ".missing");  // no table: unknown, and the launch is counted all the same
  const yuan::emu::Traffic t = counted(traffic_probe::occupancy_probe, 1, 256, 0, out.p);
  EXPECT_EQ(t.registers, -1);
  EXPECT_EQ(t.occupancy, -1.0);
  EXPECT_EQ(t.written_bytes, 256u * 4);
  yuan::emu::set_ptxas_table("");
  std::remove(path.c_str());
}

// The checks see a pack as one 16-byte access too: an uninitialised byte in it, and two blocks writing it.
__global__ void pack_of(__nv_bfloat16* out, const __nv_bfloat16* in, int write_same) {
  const yuan::gpu::PackBf16 x = yuan::gpu::load_pack(in);
  yuan::gpu::store_pack(out + (write_same ? 0 : 8 * blockIdx.x), x);
}

TEST_F(EmulatorChecks, PackAccessesAreCheckedWhole) {
  Exact<__nv_bfloat16> in(8, false), out(16);
  CUDA_CHECK(cudaMemset(in.p, 0, 14));  // the pack's last element never written
  launch(pack_of, 1, 1, 0, 0, out.p, in.p, 0);
  expect_report(cudaErrorLaunchFailure, Check::Uninitialised, "pack_of", {0, 0, 0}, {0, 0, 0}, in.p + 7,
                "byte 14 of a 16-byte allocation");
  CUDA_CHECK(cudaMemset(in.p, 0, 16));
  launch(pack_of, 2, 1, 0, 0, out.p, in.p, 0);
  expect_no_report();  // a pack each
  launch(pack_of, 2, 1, 0, 0, out.p, in.p, 1);
  expect_report(cudaErrorLaunchFailure, Check::GlobalRace, "pack_of", {1, 0, 0}, {0, 0, 0}, out.p,
                "which thread (0,0,0) of block (0,0,0) wrote in this launch");
}

}  // namespace
#endif  // YUAN_EMU
