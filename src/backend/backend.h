// A backend: one device's flat buffers of N elements (the working weights in formats().weights and their fp32
// gradients), the op vocabulary on that memory (backend/ops_interface.h), memory for the programs that run on it,
// its streams, and the transfers between device and host that the optimizer's offload pipeline needs. It knows
// devices, memory, streams and ops, not the model: what the elements of the flat buffers are (a GPT's parameter
// table) is the program's business (program/params.h lays a ParamLayout over them). The program
// (program/program.h) drives the ops; the ZeRO optimizer (optim/zero.h) and the communicators
// (comm/communicator.h) work on the flat buffers. Backends are chosen by Device through the registry at the
// bottom of this file.
//
// Memory contract: the weights and the gradients are flat, size() elements long. The weights are in
// formats().weights (bf16 on CUDA), the gradients fp32; the optimizer keeps the fp32 master copy on the host and
// moves ranges in and out. A sharded backend (ZeRO-3) holds only this rank's shards and no gradients: the
// optimizer gathers what a pass uses into memory from alloc().
//
// Work beside compute (the offload pipeline of optim/zero.h): a device backend runs its compute on stream() and
// gradient copies and weight uploads on copy streams, ordered by events: a gradient copy runs after the compute
// enqueued before it (and after the work on the stream it is given, a communicator's); compute enqueued after an
// upload, after zero_grads or after compute_after_transfers() runs after it and after every gradient copy. Host
// backends finish each call before returning, which is what the defaults below do.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "backend/kernel_account.h"
#include "backend/ops_interface.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/memory.h"
#include "util/stream.h"

namespace yuan {

enum class Device { Cpu, Cuda };
const char* device_name(Device d);

// The FLOP/s that MFU is a fraction of, and where the number comes from (the step log says which).
struct PeakFlops {
  double flops = 0;
  std::string source;
};

// Memory a backend handed out, released by the backend's own function when this goes (move-only). Host memory is
// accounted under its Mem category like a HostArray; device memory is not host memory and is not.
class Allocation {
 public:
  using Release = void (*)(void*);
  Allocation() = default;
  Allocation(void* p, size_t bytes, Release release, std::optional<Mem> host_category);
  ~Allocation();
  Allocation(Allocation&& o) noexcept { swap(o); }
  Allocation& operator=(Allocation&& o) noexcept {
    Allocation tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void swap(Allocation& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(release_, o.release_);
    std::swap(category_, o.category_);
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
  Release release_ = nullptr;
  std::optional<Mem> category_;
};

// Zeroed, 64-byte aligned host memory, accounted under `cat`.
Allocation host_allocation(size_t bytes, Mem cat);

// What a backend is made for: the size of its flat buffers, and what its ops' scratch is sized by. Says nothing
// of a model (program/params.h backend_spec derives it from a parameter layout).
struct BackendSpec {
  size_t elements = 0;   // of each flat buffer
  bool sharded = false;  // ZeRO-3: the weights are this rank's shards, and there are no gradients
  int width = 0;         // the activations' row width that the ops' scratch is sized for (TensorFormats)
  AttentionPath attention = AttentionPath::Own;  // whose attention kernels the ops run (choose_attention)
};

class Backend {
 public:
  explicit Backend(const BackendSpec& spec);
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  const char* name() const { return device_name(device()); }
  const TensorFormats& formats() const;
  virtual Ops& ops() = 0;
  // Host backends: the fp32 FMA rate measured on this process's threads. Device backends: the device's dense
  // bf16 tensor peak.
  virtual PeakFlops peak_flops();

  // ---- the flat buffers ----
  size_t size() const { return size_; }  // elements of each flat buffer
  bool sharded() const { return sharded_; }  // ZeRO-3 shards, no gradients
  AttentionPath attention() const { return attention_; }  // whose attention kernels its ops run
  // [1, size()] views of the whole buffers (grads() is empty when sharded).
  const Tensor& weights() const { return weights_; }
  const Tensor& grads() const { return grads_; }
  // fp32 values in and out of the working weights [offset, offset+count), converted; they return when done.
  virtual void set_params(const float* src, size_t offset, size_t count) = 0;
  virtual void get_params(float* dst, size_t offset, size_t count) = 0;
  virtual void zero_grads(size_t offset, size_t count) = 0;
  // fp32 copy of gradient range [offset, offset+count) into host memory.
  virtual void grads_to_host(size_t offset, size_t count, float* dst) = 0;

  // ---- memory ----
  // Zeroed memory where the ops can reach it (host memory on the CPU, device memory on CUDA).
  virtual Allocation alloc(size_t bytes, Mem cat) = 0;
  // Host memory that the device reads and writes asynchronously (page-locked on CUDA, so copies run by DMA
  // beside compute); zeroed and accounted under `cat`.
  virtual Allocation alloc_transfer(size_t bytes, Mem cat) { return host_allocation(bytes, cat); }

  // ---- streams and asynchronous transfers ----
  // The compute stream, or null when every call completes before returning.
  virtual DeviceStream stream() { return nullptr; }
  // The fp32 tensor `src` (memory from alloc(), or the gradients) into transfer memory `dst`, densely, after the
  // compute enqueued so far and the work enqueued so far on `after` (may be null); dst is complete after
  // wait_transfers().
  virtual void to_host_async(float* dst, const Tensor& src, DeviceStream after) {
    (void)after;
    ops().to_host_f32(dst, src);
  }
  // The same for gradient range [offset, offset+count).
  void grads_to_host_async(size_t offset, size_t count, float* dst, DeviceStream after);
  virtual void wait_transfers() {}
  // Compute enqueued from now on runs after every gradient copy enqueued so far (the program calls this before
  // accumulating into gradients that may still be on their way to the host).
  virtual void compute_after_transfers() {}
  // Compute enqueued from now on runs after the work enqueued so far on `other` (a communicator's stream: a
  // received activation is read, a sent one overwritten, only after the transfer).
  virtual void compute_after(DeviceStream other) { (void)other; }
  // Working weights [offset, offset+count) from transfer memory `src` in weights().dtype, on copy lane 0 or 1 (two
  // lanes let the caller fill one staging buffer while the other is in flight); src must stay unchanged until
  // wait_upload(lane).
  virtual void params_from_host_async(const void* src, size_t offset, size_t count, int lane);
  virtual void wait_upload(int lane) { (void)lane; }

  // Profiling windows (profile.steps): start/stop an external profiler's capture and name the phases inside.
  // The CUDA backend maps them to cudaProfilerStart/Stop and NVTX ranges (nsys/ncu --profile-from-start off);
  // CPU profilers (perf, VTune) attach to the process instead, so the CPU backend leaves them empty.
  virtual void profiler(bool capture) { (void)capture; }
  virtual void range_push(const char* name) { (void)name; }
  virtual void range_pop() {}
  // The per-kernel account of profile.kernels (backend/kernel_account.h), with what it needs made now (its event
  // pool); null where the device keeps none (the CPU, where validation refuses the key).
  virtual std::unique_ptr<KernelAccount> kernel_account() { return nullptr; }

 protected:
  void check_range(size_t offset, size_t count) const;
  // The derived constructor points these at its buffers (grads_ stays empty when sharded).
  Tensor weights_, grads_;

 private:
  size_t size_ = 0;
  bool sharded_ = false;
  AttentionPath attention_ = AttentionPath::Own;
};

// ---- the registry: one entry per backend compiled in ----

// What train.device asks for: a device, or the best one available (cuda when built with it and a GPU is visible).
struct DeviceRequest {
  bool automatic = true;
  Device device = Device::Cpu;
};
// Parses "cpu", "cuda" or "auto"; throws Error naming `key` and the choices otherwise.
DeviceRequest parse_device(const std::string& text, const char* key);
// The device the request resolves to here; throws when it names a backend not built in or without a device.
Device resolve_device(const DeviceRequest& r);
// Makes this process use one device of kind `d`, spreading the ranks of a node over its devices (node-local rank
// `local_rank` gets device local_rank % count), and returns that device's index: -1 for host memory. Call before
// making the backend and the communicators.
int select_device(Device d, int local_rank);
// The device a job would use where its devices are visible (planning on a login node): the one asked for, or the
// first backend built in (cuda when built with it) for auto. Throws for a backend not built in.
Device planned_device(const DeviceRequest& r);

// Whose attention kernels a backend runs, and why (model.attention, which program/program.h choose_attention
// brings here as `request`): nullopt takes cuDNN's where the device's backend has them and they run heads of
// `head_size` over `seq_len` positions here, this project's otherwise (`why` then says what cuDNN lacked); Cudnn
// throws Error naming the reason where they cannot run; Own takes this project's.
struct AttentionChoice {
  AttentionPath path = AttentionPath::Own;
  std::string why;  // the library and its version on cudnn, what ruled cuDNN out on an automatic own
};
AttentionChoice choose_attention(Device device, std::optional<AttentionPath> request, int head_size, int seq_len);

// How `device` stores the program's tensors; needs no device.
const TensorFormats& tensor_formats(Device device);
// Free memory of the device this process uses (SIZE_MAX for host memory, which the plan does not bound).
size_t device_free_bytes(Device device);
std::unique_ptr<Backend> make_backend(Device device, const BackendSpec& spec);

}  // namespace yuan
