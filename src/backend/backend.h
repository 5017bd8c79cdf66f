// The compute backend: one GPT replica's forward and backward on one device. The trainer, the ZeRO optimizer
// and the tools talk to a model only through this interface; the CPU backend (src/backend/cpu_backend.cpp,
// OpenMP + OpenBLAS) is the reference, the CUDA backend (cuda/) implements the same contract.
//
// Memory contract: the backend owns the working weights and the gradient buffer, both flat, in ParamLayout
// order, `padded_size()` elements long (the tail past layout().total() is zero and stays zero). They may live
// in device memory and in lower precision; the optimizer keeps the fp32 master copy on the host and moves
// ranges in and out with set_params / grads_to_host. The Communicator works directly on these buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "model/gpt.h"
#include "util/dtype.h"

namespace yuan {

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::F32;
};

// Called during backward with a module index (reverse layout order) once that module's gradient for the
// current micro-batch is complete, so gradient communication can overlap the rest of backward.
using ModuleReadyFn = std::function<void(int module)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual size_t padded_size() const = 0;
  virtual int max_micro_batch() const = 0;

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
