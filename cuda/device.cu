// The device this process uses: selection, free memory, its bf16 peak, and its memory as Allocations.
#include "device.cuh"

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "backend/cuda_backend.h"
#include "comm/nccl.h"
#include "cuda_check.h"
#include "kernel_account.cuh"

namespace yuan {

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int cuda_select_device(int local_rank) {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  YUAN_CHECK(n > 0, "no CUDA device is visible to this process");
  const int dev = local_rank % n;
  CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

size_t cuda_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

PeakFlops cuda_peak_flops() {
  int dev = 0, sms = 0, khz = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const std::string name = prop.name;
  // First match wins: the PCIe and NVL parts before the SXM ones whose names they contain.
  const std::pair<const char*, double> known[] = {{"H100 PCIe", 756}, {"H100 NVL", 835}, {"H200 NVL", 835},
                                                  {"H100", 989},      {"H200", 989},     {"A100", 312}};
  for (const auto& [part, tflops] : known)
    if (name.find(part) != std::string::npos)
      return {tflops * 1e12, strf("%s, dense bf16 from the datasheet", prop.name)};
  // Tensor-core bf16 FLOPs per SM per clock, dense: 2048 on sm_80 (A100), 4096 on sm_90 (H100).
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  const double per_clock = prop.major >= 9 ? 4096 : prop.major == 8 && prop.minor == 0 ? 2048 : 1024;
  return {sms * (khz * 1e3) * per_clock,
          strf("%s, dense bf16 estimated: %d SMs x %.0f MHz x %.0f FLOP/clock", prop.name, sms, khz / 1e3, per_clock)};
}

namespace {

// The bound on the host's waits for the device, and what to call past it: unbounded (0) until an NCCL communicator
// exists; every communicator sets the same dist.nccl_timeout_s.
struct WaitBound {
  double seconds = 0;
  NcclTimeout on_timeout;
};
std::mutex bound_mutex;
WaitBound bound;

WaitBound wait_bound() {
  std::lock_guard<std::mutex> lock(bound_mutex);
  return bound;
}

// `query()` (the CUDA call `query_call`) until it answers cudaSuccess, against the bound `b`; cudaErrorNotReady is
// "not yet", any other answer the device's error. The poll step is NCCL's own (nccl_communicator.cu): short against
// any step, and far less than a core.
template <class Query>
void wait_polled(const WaitBound& b, const char* what, const char* query_call, Query query) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  for (;;) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady)
      gpu::throw_library_error("CUDA", query_call, cudaGetErrorString(e), __FILE__, __LINE__);
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited > b.seconds) {
      const std::string op = strf("a device synchronize (%s)", what);
      if (b.on_timeout) b.on_timeout(op.c_str(), waited);
      throw Error(strf("CUDA device (rank %d on %s): %s not complete after dist.nccl_timeout_s = %g s: the device's "
                       "work waits for an NCCL operation whose peer rank died or is stuck",
                       process_rank(), process_host().c_str(), op.c_str(), b.seconds));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

void bound_device_waits(double timeout_s, NcclTimeout on_timeout) {
  std::lock_guard<std::mutex> lock(bound_mutex);
  bound = {timeout_s, std::move(on_timeout)};
}

namespace gpu {

bool device_waits_bounded() { return wait_bound().seconds > 0; }

void wait_stream_bounded(cudaStream_t s, const char* what) {
  wait_polled(wait_bound(), what, "cudaStreamQuery", [s] { return cudaStreamQuery(s); });
}

void wait_event_bounded(cudaEvent_t e, const char* what) {
  wait_polled(wait_bound(), what, "cudaEventQuery", [e] { return cudaEventQuery(e); });
}

AccountPeak cuda_account_peak() {
  const PeakFlops flops = cuda_peak_flops();
  int dev = 0, khz = 0, bus_bits = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  AccountPeak p;
  p.flops = flops.flops;
  // The parts input/machines describes, by the name the driver gives them; one direction of each link.
  struct Part {
    const char* name;
    double hbm, host, nvlink;
    const char* file;
  };
  const Part parts[] = {{"H100 80GB HBM3", 3.35e12, 64e9, 450e9, "input/machines/h100-sxm.ini"},
                        {"A100-SXM4-80GB", 2.039e12, 32e9, 300e9, "input/machines/a100.ini"},
                        {"V100-SXM2", 900e9, 16e9, 150e9, "input/machines/v100.ini"}};
  for (const Part& part : parts) {
    if (!std::strstr(prop.name, part.name)) continue;
    p.bytes_per_s = part.hbm;
    p.host_bytes_per_s = part.host;
    p.link_bytes_per_s = part.nvlink;
    p.source = strf("FLOPs: %s; bandwidth: %s (mem_bw, datasheet)", flops.source.c_str(), part.file);
    p.link_source = strf("%s: PCIe (pcie_bw) and NVLink (link.intra) one direction, datasheet; a group across "
                         "nodes runs on the slower network",
                         part.file);
    return p;
  }
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  p.bytes_per_s = 2.0 * khz * 1e3 * bus_bits / 8;  // double data rate
  p.source = strf("FLOPs: %s; bandwidth: %s, memory clock %.0f MHz x %d-bit bus x 2", flops.source.c_str(), prop.name,
                  khz / 1e3, bus_bits);
  p.link_source = "no link rates known for this device (none in input/machines): transfers have no roofline";
  return p;
}

// Release functions run in destructors: errors are ignored (the process is usually on its way out).
Allocation device_allocation(size_t bytes) {
  if (bytes == 0) return {};
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  Allocation a(p, bytes, [](void* q) { cudaFree(q); }, std::nullopt);
  // The legacy stream's memset does not order the backend's non-blocking streams: finish it here.
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  return a;
}

Allocation pinned_allocation(size_t bytes, Mem cat) {
  if (bytes == 0) return {};
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  std::memset(p, 0, bytes);
  return Allocation(p, bytes, [](void* q) { cudaFreeHost(q); }, cat);
}

}  // namespace gpu
}  // namespace yuan
