// The CUDA runtime API of the emulator: one device (device 0, described as the target of target.cpp, with 16 GiB
// of memory), its memory in the arenas of memory.cpp, streams and events (streams.cpp), copies that check their ranges
// as the driver does and carry device memory's initialisation state along. A timing event's record also stamps the
// host clock when the emulator reaches it, so cudaEventElapsedTime measures the emulator, not a device.
//
// Copies follow CUDA's synchronisation rules ("API synchronization behavior"): cudaMemcpy waits for the legacy
// stream's work; cudaMemcpyAsync runs in stream order when the host side is pinned memory, and otherwise, like
// the driver's staged copies of pageable memory, completes before it returns, after the stream's earlier work.
// In the Latest stream mode a pageable upload is staged at the call and lands in stream order, as the driver's does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>

#include "emulator.h"

namespace yuan::emu {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  StreamPoint point;
  bool timing = true;  // not created with cudaEventDisableTiming
  // When the emulator reached the latest record, set by a step enqueued just before its point; a slot per record,
  // so that an earlier record reached late does not stamp a later one.
  std::shared_ptr<std::optional<Clock::time_point>> reached;
};

std::map<std::pair<std::string, std::string>, uint64_t>& host_call_counts() {  // (call, caller): count
  static auto* m = new std::map<std::pair<std::string, std::string>, uint64_t>;
  return *m;
}
// A call that waits for the device or allocates (host_calls), from the code at `caller`.
void note_host_call(const char* call, const void* caller) { host_call_counts()[{call, function_name(caller)}]++; }

const char* default_message(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
  }
  return "unknown error";
}

// Every API call: a sticky error fails it; a failure is remembered for cudaGetLastError.
cudaError_t done(cudaError_t e) {
  if (e != cudaSuccess) last_error() = e;
  return e;
}

// A call's argument CUDA would refuse: reported (the caller's CUDA_CHECK then throws with the message). Memory a
// copy or memset would reach outside its allocation is an out-of-bounds access; anything else a refused call.
cudaError_t refuse(const char* call, const std::string& why, cudaError_t e = cudaErrorInvalidValue,
                   Check c = Check::Library) {
  report(c, Where{}, 0, std::string(call) + ": " + why, false, e);
  return done(e);
}

bool pinned(const void* p) { return in_arena(Space::Pinned, reinterpret_cast<uintptr_t>(p)); }
bool device(const void* p) { return in_arena(Space::Device, reinterpret_cast<uintptr_t>(p)); }

// One side of a copy: device memory must lie in one live allocation (uninitialised bytes may be copied: their state
// travels with them), pinned memory too; other host memory is the caller's business.
std::string check_side(const void* p, size_t n, bool is_device) {
  if (is_device) return check_range(Space::Device, p, n, false);
  if (device(p)) return "a device pointer where the copy's kind says host memory";
  if (pinned(p)) return check_range(Space::Pinned, p, n, false);
  return {};
}

// Every mode: the pinned host buffer of an asynchronous copy is the copy's from its enqueue until the host
// synchronises with it (a stream or event synchronise, a query that found it complete, a device synchronise), and a
// host write in between is a race whatever the timing. A source is held to what it held at the enqueue, when the
// host synchronises; a destination to what it held at the enqueue, when the copy writes it, and then to what the
// copy wrote, when the host synchronises. Where the device writes the buffer meanwhile (a copy down into a staging
// buffer that an upload enqueued earlier reads, in stream order) the buffer is let go unchecked: that change is the
// device's, held to the happens-before check. A host read in between is not seen this way: Latest mode fills a
// pending download's destination with the NaN pattern of fresh device memory, which such a read gets.
struct Owned {
  int stream;
  uint64_t seq;  // the copy: a point of its stream
  const char* call;
  std::string caller;  // the code that enqueued the copy
  const void* p;
  std::string bytes;  // what the buffer must still hold
  bool source;
};
std::vector<Owned>& owned() {
  static std::vector<Owned>* o = new std::vector<Owned>;
  return *o;
}

Owned* owned_by(const Operation& op) {
  for (Owned& w : owned())
    if (w.stream == op.stream && w.seq == op.seq) return &w;
  return nullptr;
}

bool overlaps_owned(uintptr_t begin, uintptr_t end) {
  for (const Owned& w : owned())
    if (reinterpret_cast<uintptr_t>(w.p) < end && begin < reinterpret_cast<uintptr_t>(w.p) + w.bytes.size())
      return true;
  return false;
}

// The `n` bytes at `p` that `op`, a copy of `call` from `caller`, reads (a source) or writes, held as they are now.
void hold(const Operation& op, const char* call, const std::string& caller, const void* p, size_t n, bool source) {
  std::string now(static_cast<const char*>(p), n);
  if (Owned* w = owned_by(op)) return void(w->bytes = std::move(now));
  owned().push_back(Owned{op.stream, op.seq, call, caller, p, std::move(now), source});
}

// Reports a host write of `w`'s buffer since it was held.
void verify(const Owned& w) {
  if (sticky_error() || !std::memcmp(w.p, w.bytes.data(), w.bytes.size())) return;
  const char* at = static_cast<const char*>(w.p);
  size_t k = 0;
  while (at[k] == w.bytes[k]) k++;
  const uintptr_t b = reinterpret_cast<uintptr_t>(at);
  const Allocation* a = allocation_near(b);
  report(Check::StreamRace, Where{}, b + k,
         format("the host wrote byte %zu of the %zu-byte pinned %s %p (offset %zu of the %zu-byte allocation at "
                "0x%zx) of %s called from %s on %s, which %s it, with no synchronisation with the copy ordering the "
                "two: found at %s",
                k, w.bytes.size(), w.source ? "source" : "destination", w.p, b + k - a->begin, a->bytes, a->begin,
                w.call, w.caller.c_str(), stream_name(w.stream).c_str(), w.source ? "reads" : "writes",
                current_call().c_str()),
         true, cudaErrorLaunchFailure);
}

}  // namespace

void check_owned_pinned() {
  auto& o = owned();
  for (size_t i = 0; i < o.size();) {
    if (!host_has_seen(o[i].stream, o[i].seq)) {
      i++;
      continue;
    }
    const Owned w = std::move(o[i]);
    o.erase(o.begin() + static_cast<std::ptrdiff_t>(i));
    verify(w);
  }
}

void release_owned_pinned(uintptr_t begin, uintptr_t end, const Operation* by) {
  auto& o = owned();
  o.erase(std::remove_if(o.begin(), o.end(),
                         [&](const Owned& w) {
                           const uintptr_t b = reinterpret_cast<uintptr_t>(w.p);
                           const bool own = by && by->stream == w.stream && by->seq == w.seq;
                           return !own && b < end && begin < b + w.bytes.size();
                         }),
          o.end());
}

namespace {

cudaError_t copy(const char* call, const void* caller, void* dst, const void* src, size_t width, size_t height,
                 size_t dpitch, size_t spitch, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  if (sticky_error()) return done(sticky_error());
  if (!valid_stream(stream)) return refuse(call, "not a live stream", cudaErrorInvalidResourceHandle);
  if (kind == cudaMemcpyDefault)
    kind = device(src) ? (device(dst) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                       : (device(dst) ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const size_t dspan = height && width ? (height - 1) * dpitch + width : 0;
  const size_t sspan = height && width ? (height - 1) * spitch + width : 0;
  if (height && width) {
    std::string bad = check_side(dst, dspan, dst_dev);
    if (bad.empty()) bad = check_side(src, sspan, src_dev);
    if (!bad.empty()) return refuse(call, bad, cudaErrorInvalidValue, Check::OutOfBounds);
  }
  const bool latest = stream_mode() == StreamMode::Latest;
  // Latest: pageable host memory to the device is staged at the call, as the driver stages it, and lands later.
  std::shared_ptr<std::string> staged;
  if (async && latest && !src_dev && !pinned(src) && dst_dev && sspan) {
    staged = std::make_shared<std::string>(static_cast<const char*>(src), sspan);
    src = staged->data();
  }
  auto run = [=] {
    for (size_t r = 0; r < height; r++) {
      char* d = static_cast<char*>(dst) + r * dpitch;
      const char* s = static_cast<const char*>(src) + r * spitch;
      std::memmove(d, s, width);
      if (dst_dev) copy_shadow(d, s, width);
    }
  };
  auto note = [=] {  // the copy's accesses, for the happens-before check
    for (size_t r = 0; r < height; r++) {
      note_access(static_cast<const char*>(src) + r * spitch, width, false);
      note_access(static_cast<char*>(dst) + r * dpitch, width, true);
    }
  };
  // Host memory that is not pinned is copied when the call returns, after the stream's work so far.
  const bool deferred = async && (src_dev || pinned(src) || staged) && (dst_dev || pinned(dst));
  if (deferred) {
    // The pinned side of a copy between the device and the host, the copy's until the host synchronises with it
    // (Owned): a contiguous one, as the offload pipeline's are.
    const bool owns_src = pinned(src) && dst_dev && height == 1, owns_dst = pinned(dst) && src_dev && height == 1;
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
    if (latest && owns_dst && !overlaps_owned(d, d + width)) std::memset(dst, 0xff, width);
    const std::string from = owns_src || owns_dst ? function_name(caller) : std::string();
    const std::shared_ptr<Operation> op = enqueue(stream, [run, note, staged, owns_dst, call, from, dst,
                                                           width](bool) {
      // The happens-before check first: another stream's copy that changed the buffer out of order is a race
      // between the two, not a host write.
      note();
      if (!ordered_so_far()) return true;
      if (owns_dst)
        if (const Owned* w = owned_by(*t_operation)) verify(*w);
      run();
      if (owns_dst) hold(*t_operation, call, from, dst, width, false);
      return true;
    });
    if ((owns_src || owns_dst) && !owned_by(*op))  // Earliest has run it already
      hold(*op, call, from, owns_src ? src : dst, width, owns_src);
    return cudaSuccess;
  }
  if (async) note_host_call(call, caller);  // pageable memory: the call waits for the stream, as the driver's does
  const StreamPoint p = stream_point(async ? stream : cudaStreamLegacy);
  run_until(p, true);
  if (sticky_error()) return done(sticky_error());
  // The copy is the marker's operation, in its stream's order; the host has its data when the call returns (a
  // pageable upload's device side is left ordered by the stream alone, as the driver lands it).
  {
    Operation* outer = std::exchange(t_operation, p.op.get());
    note();
    run();
    t_operation = outer;
  }
  settle(p.op);
  if (src_dev || !async) host_sees(p);
  return done(sticky_error());
}

cudaError_t memset_on(const char* call, const void* caller, void* p, int value, size_t n, cudaStream_t stream,
                      bool async) {
  Calling calling(call, caller);
  if (sticky_error()) return done(sticky_error());
  if (!valid_stream(stream)) return refuse(call, "not a live stream", cudaErrorInvalidResourceHandle);
  const std::string bad = check_range(Space::Device, p, n, false);
  if (!bad.empty()) return refuse(call, bad, cudaErrorInvalidValue, Check::OutOfBounds);
  enqueue(async ? stream : cudaStreamLegacy, [=](bool) {
    std::memset(p, value, n);
    mark_initialised(p, n);
    note_access(p, n, true);
    return true;
  });
  return cudaSuccess;
}

}  // namespace

std::vector<HostCall> host_calls() {
  Lock lock(mutex());
  std::vector<HostCall> out;
  for (const auto& [key, n] : host_call_counts()) out.push_back({key.first, key.second, n});
  return out;
}

cudaError_t& last_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}

}  // namespace yuan::emu

using namespace yuan::emu;

// ---- device ----

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  Lock lock(mutex());
  return device == 0 ? cudaSuccess : done(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return done(cudaErrorInvalidDevice);
  const Target& d = target();
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s (yuanlm CUDA emulator)", d.description);
  // The memory is not the part's: tests size what does not fit by YUAN_EMU_DEVICE_MB (memory.cpp).
  prop->totalGlobalMem = device_memory_bytes();
  prop->sharedMemPerBlock = d.shared_per_block;
  prop->sharedMemPerBlockOptin = d.shared_per_block_optin;
  prop->sharedMemPerMultiprocessor = d.shared_per_sm;
  prop->reservedSharedMemPerBlock = d.shared_reserved_per_block;
  prop->regsPerBlock = d.registers_per_block;
  prop->regsPerMultiprocessor = d.registers_per_sm;
  prop->warpSize = d.warp_size;
  prop->maxThreadsPerBlock = d.threads_per_block;
  prop->maxThreadsPerMultiProcessor = d.threads_per_sm;
  prop->maxBlocksPerMultiProcessor = d.blocks_per_sm;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->clockRate = d.clock_khz;
  prop->memoryClockRate = d.memory_clock_khz;
  prop->memoryBusWidth = d.memory_bus_bits;
  prop->major = d.major;
  prop->minor = d.minor;
  prop->multiProcessorCount = d.sms;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return done(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrClockRate: *value = p.clockRate; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMemoryClockRate: *value = p.memoryClockRate; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = static_cast<int>(p.sharedMemPerMultiprocessor); break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = p.regsPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = p.maxBlocksPerMultiProcessor; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = static_cast<int>(p.reservedSharedMemPerBlock); break;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(mutex());
  note_host_call("cudaDeviceSynchronize", __builtin_return_address(0));
  Calling calling("cudaDeviceSynchronize", __builtin_return_address(0));
  run_all_streams();
  host_sees_all();
  return done(sticky_error());
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Lock lock(mutex());
  *total_bytes = device_memory_bytes();
  *free_bytes = device_memory_bytes() - device_bytes_in_use();
  return done(sticky_error());
}

// ---- errors ----

cudaError_t cudaGetLastError() {
  Lock lock(mutex());
  if (sticky_error()) return sticky_error();
  return std::exchange(last_error(), cudaSuccess);
}

cudaError_t cudaPeekAtLastError() {
  Lock lock(mutex());
  return sticky_error() ? sticky_error() : last_error();
}

const char* cudaGetErrorString(cudaError_t error) {
  Lock lock(mutex());
  const char* m = report_message(error);
  return m ? m : default_message(error);
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaError";
  }
}

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Lock lock(mutex());
  note_host_call("cudaMalloc", __builtin_return_address(0));
  if (sticky_error()) return done(sticky_error());
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  *ptr = allocate(Space::Device, bytes);
  return *ptr ? cudaSuccess : done(cudaErrorMemoryAllocation);
}

// cudaFree waits for the device: work still queued may use the memory.
cudaError_t cudaFree(void* ptr) {
  Lock lock(mutex());
  note_host_call("cudaFree", __builtin_return_address(0));
  Calling calling("cudaFree", __builtin_return_address(0));
  if (!ptr) return cudaSuccess;
  run_all_streams();
  host_sees_all();  // cudaFree synchronises the device
  if (!release(Space::Device, ptr))
    return refuse("cudaFree", format("%p is not the start of a live device allocation", ptr));
  return done(sticky_error());
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  Lock lock(mutex());
  note_host_call("cudaHostAlloc", __builtin_return_address(0));
  *ptr = bytes ? allocate(Space::Pinned, bytes) : nullptr;
  return *ptr || !bytes ? cudaSuccess : done(cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  Lock lock(mutex());
  note_host_call("cudaFreeHost", __builtin_return_address(0));
  Calling calling("cudaFreeHost", __builtin_return_address(0));
  if (!ptr) return cudaSuccess;
  run_all_streams();
  host_sees_all();
  if (!release(Space::Pinned, ptr))
    return refuse("cudaFreeHost", format("%p is not the start of a live pinned allocation", ptr));
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  Lock lock(mutex());
  note_host_call("cudaMemset", __builtin_return_address(0));
  return memset_on("cudaMemset", __builtin_return_address(0), ptr, value, bytes, cudaStreamLegacy, false);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  Lock lock(mutex());
  return memset_on("cudaMemsetAsync", __builtin_return_address(0), ptr, value, bytes, stream, true);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Lock lock(mutex());
  note_host_call("cudaMemcpy", __builtin_return_address(0));
  Calling calling("cudaMemcpy", __builtin_return_address(0));
  return copy("cudaMemcpy", __builtin_return_address(0), dst, src, bytes, 1, bytes, bytes, kind, cudaStreamLegacy, false);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("cudaMemcpyAsync", __builtin_return_address(0));
  return copy("cudaMemcpyAsync", __builtin_return_address(0), dst, src, bytes, 1, bytes, bytes, kind, stream, true);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("cudaMemcpy2DAsync", __builtin_return_address(0));
  if (width > dpitch || width > spitch) return refuse("cudaMemcpy2DAsync", "width larger than a pitch");
  return copy("cudaMemcpy2DAsync", __builtin_return_address(0), dst, src, width, height, dpitch, spitch, kind, stream, true);
}

// ---- streams and events ----

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  Lock lock(mutex());
  *stream = create_stream(!(flags & cudaStreamNonBlocking));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("cudaStreamDestroy", __builtin_return_address(0));
  if (!stream || stream == cudaStreamLegacy || !valid_stream(stream))
    return refuse("cudaStreamDestroy", "not a stream this program created", cudaErrorInvalidResourceHandle);
  destroy_stream(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(mutex());
  note_host_call("cudaStreamSynchronize", __builtin_return_address(0));
  Calling calling("cudaStreamSynchronize", __builtin_return_address(0));
  if (!valid_stream(stream)) return refuse("cudaStreamSynchronize", "not a live stream", cudaErrorInvalidResourceHandle);
  run_stream(stream, true);
  host_sees_stream(stream);
  return done(sticky_error());
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(mutex());
  Calling calling("cudaStreamQuery", __builtin_return_address(0));
  if (!valid_stream(stream)) return refuse("cudaStreamQuery", "not a live stream", cudaErrorInvalidResourceHandle);
  const bool complete = run_stream(stream, false);
  if (sticky_error()) return done(sticky_error());
  if (complete) host_sees_stream(stream);  // a query that finds the work done orders the host after it, as a synchronise does
  return complete ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  Lock lock(mutex());
  if (!valid_stream(stream) || !event)
    return refuse("cudaStreamWaitEvent", "not a live stream and event", cudaErrorInvalidResourceHandle);
  Calling calling("cudaStreamWaitEvent", __builtin_return_address(0));
  stream_waits(stream, reinterpret_cast<Event*>(event)->point);  // the record the wait sees now, not a later one
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  auto* e = new Event;
  e->timing = !(flags & cudaEventDisableTiming);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(mutex());
  if (!event) return refuse("cudaEventDestroy", "a null event", cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(mutex());
  if (!valid_stream(stream) || !event)
    return refuse("cudaEventRecord", "not a live stream and event", cudaErrorInvalidResourceHandle);
  Event* e = reinterpret_cast<Event*>(event);
  if (e->timing) {
    auto reached = std::make_shared<std::optional<Clock::time_point>>();
    enqueue(stream, [reached](bool) {
      *reached = Clock::now();
      return true;
    });
    e->reached = reached;
  }
  e->point = stream_point(stream);
  return done(sticky_error());
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(mutex());
  if (!start || !end) return refuse("cudaEventElapsedTime", "a null event", cudaErrorInvalidResourceHandle);
  const Event *a = reinterpret_cast<Event*>(start), *b = reinterpret_cast<Event*>(end);
  if (!a->timing || !b->timing)
    return refuse("cudaEventElapsedTime", "an event created with cudaEventDisableTiming",
                  cudaErrorInvalidResourceHandle);
  if (!a->reached || !b->reached)
    return refuse("cudaEventElapsedTime", "an event never recorded", cudaErrorInvalidResourceHandle);
  if (!*a->reached || !*b->reached) return done(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(**b->reached - **a->reached).count();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(mutex());
  note_host_call("cudaEventSynchronize", __builtin_return_address(0));
  Calling calling("cudaEventSynchronize", __builtin_return_address(0));
  if (!event) return refuse("cudaEventSynchronize", "a null event", cudaErrorInvalidResourceHandle);
  const StreamPoint& p = reinterpret_cast<Event*>(event)->point;
  run_until(p, true);
  host_sees(p);
  return done(sticky_error());
}

// The emulated device has no progress of its own: a query runs the work it asks about, unless that waits for
// something outside the process (a peer's MPI transfer).
cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(mutex());
  Calling calling("cudaEventQuery", __builtin_return_address(0));
  if (!event) return refuse("cudaEventQuery", "a null event", cudaErrorInvalidResourceHandle);
  const StreamPoint& p = reinterpret_cast<Event*>(event)->point;
  const bool complete = run_until(p, false);
  if (sticky_error()) return done(sticky_error());
  if (complete) host_sees(p);
  return complete ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaFuncGetName(const char** name, const void* func) {
  Lock lock(mutex());
  static auto* names = new std::map<const void*, std::string>;  // the pointers given out stay valid
  std::string& n = (*names)[func];
  if (n.empty()) n = function_name(func);
  *name = n.c_str();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  Lock lock(mutex());
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return refuse("cudaFuncSetAttribute", "only cudaFuncAttributeMaxDynamicSharedMemorySize is emulated");
  std::string why;
  if (set_shared_opt_in(func, value, &why) != cudaSuccess) return refuse("cudaFuncSetAttribute", why);
  return cudaSuccess;
}

// ---- for the cuDNN frontend (cuda_runtime_api.h says what each models) ----

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  std::memset(attributes, 0, sizeof *attributes);
  if (device(ptr)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (pinned(ptr)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;  // what CUDA reports for memory it does not know
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Lock lock(mutex());
  if (!valid_stream(stream)) return refuse("cudaStreamIsCapturing", "not a live stream");
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id,
                                        cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                        size_t* num_dependencies) {
  Lock lock(mutex());
  if (!valid_stream(stream)) return refuse("cudaStreamGetCaptureInfo", "not a live stream");
  *status = cudaStreamCaptureStatusNone;
  // Like CUDA, the other outputs are left alone when the stream is not capturing.
  (void)id, (void)graph, (void)dependencies, (void)num_dependencies;
  return cudaSuccess;
}

namespace {
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  cudaStreamCaptureMode m = static_cast<cudaStreamCaptureMode>(*mode);
  cudaThreadExchangeStreamCaptureMode(&m);
  *mode = static_cast<CUstreamCaptureMode>(m);
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPoint(const char*, void** function, unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
  *function = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaErrorNotSupported;
}

// Not emulated (cuda_runtime_api.h): refused, and reported so that a path that reaches them shows.
namespace {
cudaError_t not_emulated(const char* call) {
  Lock lock(mutex());
  return refuse(call, "CUDA graphs, stream capture and launches by address are not emulated", cudaErrorNotSupported);
}
}  // namespace

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  return not_emulated("cudaStreamBeginCapture");
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t*) { return not_emulated("cudaStreamEndCapture"); }
cudaError_t cudaGraphCreate(cudaGraph_t*, unsigned) { return not_emulated("cudaGraphCreate"); }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return not_emulated("cudaGraphDestroy"); }
cudaError_t cudaGraphGetNodes(cudaGraph_t, cudaGraphNode_t*, size_t*) { return not_emulated("cudaGraphGetNodes"); }
cudaError_t cudaGraphGetRootNodes(cudaGraph_t, cudaGraphNode_t*, size_t*) {
  return not_emulated("cudaGraphGetRootNodes");
}
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, size_t*) {
  return not_emulated("cudaGraphNodeGetDependencies");
}
cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t, cudaGraphNode_t*, size_t*) {
  return not_emulated("cudaGraphNodeGetDependentNodes");
}
cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, size_t, cudaGraph_t) {
  return not_emulated("cudaGraphAddChildGraphNode");
}
cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t, cudaGraph_t*) {
  return not_emulated("cudaGraphChildGraphNodeGetGraph");
}
cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, size_t, void*, const void*,
                                     size_t, cudaMemcpyKind) {
  return not_emulated("cudaGraphAddMemcpyNode1D");
}
cudaError_t cudaGraphMemcpyNodeSetParams1D(cudaGraphNode_t, void*, const void*, size_t, cudaMemcpyKind) {
  return not_emulated("cudaGraphMemcpyNodeSetParams1D");
}
cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t*, cudaGraph_t, const cudaGraphNode_t*, size_t,
                                   const cudaMemsetParams*) {
  return not_emulated("cudaGraphAddMemsetNode");
}
cudaError_t cudaGraphMemsetNodeSetParams(cudaGraphNode_t, const cudaMemsetParams*) {
  return not_emulated("cudaGraphMemsetNodeSetParams");
}
cudaError_t cudaUserObjectCreate(cudaUserObject_t*, void*, cudaHostFn_t, unsigned, unsigned) {
  return not_emulated("cudaUserObjectCreate");
}
cudaError_t cudaUserObjectRelease(cudaUserObject_t, unsigned) { return not_emulated("cudaUserObjectRelease"); }
cudaError_t cudaGraphRetainUserObject(cudaGraph_t, cudaUserObject_t, unsigned, unsigned) {
  return not_emulated("cudaGraphRetainUserObject");
}
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
  return not_emulated("cudaLaunchKernel");
}
