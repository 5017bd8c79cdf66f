// The compute backend: one GPT replica's forward and backward on one device. The trainer, the ZeRO optimizer
// and the tools talk to a model only through this interface; the CPU backend (src/backend/cpu_backend.cpp,
// OpenMP + OpenBLAS) is the reference, the CUDA backend (cuda/) implements the same contract.
//
// Memory contract: the backend owns the working weights and the gradient buffer, both flat, in ParamLayout
// order, `padded_size()` elements long (the tail past layout().total() is zero and stays zero). They may live
// in device memory and in lower precision; the optimizer keeps the fp32 master copy on the host and moves
// ranges in and out with set_params / grads_to_host. The Communicator works directly on these buffers.
//
// Work beside compute (the offload pipeline of optim/zero.h): a device backend runs its compute on stream() and
// gradient copies and weight uploads on copy streams, ordered by events: a gradient copy runs after the compute
// enqueued before it (and after the work on the stream it is given, a communicator's); compute enqueued after an
// upload or after zero_grads runs after it and after every gradient copy. Host backends finish each call before
// returning, which is what the defaults below do.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "model/gpt.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/memory.h"
#include "util/peak.h"

namespace yuan {

// The FLOP/s that MFU is a fraction of, and where the number comes from (the step log says which).
struct PeakFlops {
  double flops = 0;
  std::string source;
};

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::F32;
};

// Called during backward with a module index (reverse layout order) once that module's gradient for the
// current micro-batch is complete in the order of Backend::stream() (host backends: complete), so gradient
// communication can overlap the rest of backward.
using ModuleReadyFn = std::function<void(int module)>;

// Host memory that the device reads and writes asynchronously: page-locked by the CUDA backend (cudaHostAlloc,
// so copies run by DMA beside compute), ordinary 64-byte aligned memory for host backends. Zero-initialised,
// accounted under its Mem category like a HostArray.
class PinnedBuffer {
 public:
  using Release = void (*)(void*);
  PinnedBuffer() = default;
  PinnedBuffer(void* p, size_t bytes, Mem cat, Release release)
      : p_(p), bytes_(bytes), cat_(cat), release_(release) {
    detail::mem_account(cat_, static_cast<std::ptrdiff_t>(bytes_));
  }
  ~PinnedBuffer() {
    if (!p_) return;
    release_(p_);
    detail::mem_account(cat_, -static_cast<std::ptrdiff_t>(bytes_));
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    PinnedBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void swap(PinnedBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(cat_, o.cat_);
    std::swap(release_, o.release_);
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
  Mem cat_ = Mem::Comm;
  Release release_ = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual size_t padded_size() const = 0;
  virtual int max_micro_batch() const = 0;
  // Host backends: the fp32 FMA rate measured on this process's threads. Device backends: the device's dense
  // bf16 tensor peak.
  virtual PeakFlops peak_flops() {
    return {measure_peak_flops(), "measured fp32 FMA loop on this rank's threads"};
  }

  virtual void set_params(const float* src, size_t offset, size_t count) = 0;
  virtual void get_params(float* dst, size_t offset, size_t count) = 0;

  // tokens: B rows of T+1 ids, T = layout().config().seq_len; inputs row[0:T], targets row[1:T+1].
  // Adds d(grad_scale * mean loss)/d(params) into the gradient buffer and returns the mean loss.
  virtual float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) = 0;
  // Mean loss of B rows, no gradients.
  virtual float forward_loss(const int32_t* tokens, int B) = 0;
  // Logits at every position of one row of `len` <= seq_len input ids: len x vocab_size values.
  virtual void forward_logits(const int32_t* ids, int len, float* logits) = 0;

  virtual void zero_grads(size_t offset, size_t count) = 0;
  virtual DeviceBuffer grad_buffer() = 0;
  virtual DeviceBuffer param_buffer() = 0;
  // fp32 copy of gradient range [offset, offset+count) into host memory.
  virtual void grads_to_host(size_t offset, size_t count, float* dst) = 0;

  // cudaStream_t of the compute, or nullptr when every call completes before returning.
  virtual void* stream() { return nullptr; }
  virtual PinnedBuffer alloc_pinned(size_t bytes, Mem cat) {
    if (bytes == 0) return {};
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return PinnedBuffer(p, bytes, cat, std::free);
  }
  // grads_to_host into pinned `dst`, after the compute enqueued so far and the work enqueued so far on `after`
  // (a cudaStream_t, or nullptr); dst is complete after wait_transfers().
  virtual void grads_to_host_async(size_t offset, size_t count, float* dst, void* after) {
    (void)after;
    grads_to_host(offset, count, dst);
  }
  virtual void wait_transfers() {}
  // Working weights [offset, offset+count) from pinned `src` in param_buffer().dtype, on copy lane 0 or 1 (two
  // lanes let the caller fill one staging buffer while the other is in flight); src must stay unchanged until
  // wait_upload(lane).
  virtual void params_from_host_async(const void* src, size_t offset, size_t count, int lane) {
    (void)lane;
    YUAN_CHECK(param_buffer().dtype == DType::F32, "backend %s: no upload path for its working weights", name());
    set_params(static_cast<const float*>(src), offset, count);
  }
  virtual void wait_upload(int lane) { (void)lane; }

  // Profiling windows (profile.steps): start/stop an external profiler's capture and name the phases inside.
  // The CUDA backend maps them to cudaProfilerStart/Stop and NVTX ranges (nsys/ncu --profile-from-start off);
  // CPU profilers (perf, VTune) attach to the process instead, so the CPU backend leaves them empty.
  virtual void profiler(bool capture) { (void)capture; }
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
};

// Backend for config value train.device (cpu | cuda | auto); throws Error when the device is unavailable.
// `recompute` (train.recompute) applies to the CUDA backend; the CPU backend keeps every activation.
std::unique_ptr<Backend> make_backend(const std::string& device, const GPTConfig& cfg, int micro_batch,
                                      size_t padded_size, bool recompute = false);

}  // namespace yuan
