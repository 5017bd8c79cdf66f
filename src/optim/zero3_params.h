// ZeRO-3's parameter gathering (optim/zero.h): the backend holds only this rank's block of every module (the pieces
// of ZeroSpec, one after the other), and this ParamSource gathers a module into a buffer where a pass reads it and
// reduce-scatters its gradient as soon as backward reports it ready: this rank's piece then goes into the host
// gradient (optim.offload = host), or with the state on the device is accumulated into the device AdamW's gradient
// shard on the compute stream, at the next acquire once compute waits for the reduction (or at the end of the
// micro-batch), before the gradient buffer can be taken again.
//
// wte, wpe and ln_f, used at both ends of every micro-batch, each have their own buffer and stay gathered from their
// first use in a step until the weights change; the blocks share two buffers, so the next block (forward: the
// following one, backward: the preceding one) is gathered while the current one computes (on the communicator's
// stream; with host communicators on a thread of its own, comm/comm_thread.h), and the two blocks that end a
// forward are still there when backward starts. Gradients have the same buffers, each zeroed when a module's
// backward takes it and free once its reduction has left. Per micro-batch that moves every parameter three times
// (gathered for forward and for backward, reduce-scattered) against twice per step at zero 1 and 2 (reduce-scatter,
// all-gather), for device memory of 1/N of the weights plus those buffers. Every member of the group must run the
// same passes in the same order (one stage per pipeline).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "comm/comm_thread.h"
#include "comm/communicator.h"
#include "optim/device_adamw.h"
#include "optim/grad_buckets.h"
#include "optim/zero_spec.h"
#include "program/program.h"

namespace yuan {

// The module buffers of `modules` of `layout`, in elements, in the order Zero3Params allocates them: one for each
// module outside the blocks, in module order, then two of the largest block's size.
std::vector<size_t> zero3_buffers(const ParamLayout& layout, ModuleRange modules);
// Their sum over `modules` (empty: all of them): as many working weights as gradients.
size_t zero3_buffer_elements(const ParamLayout& layout, ModuleRange modules);
// The device memory of a backend for `layout` (program/program.h ParamMemory): whole, or with `shards` (ZeRO-3's
// shard elements, as backend_spec takes them) those and the module buffers.
ParamMemory zero_param_memory(const ParamLayout& layout, std::optional<size_t> shards);

class Zero3Params final : public ParamSource {
 public:
  // The modules of `spec` (stage 3) over a backend holding this rank's shard; reduced gradients go into `device`'s
  // gradient shard where the state is on the device (not null), else into `host`, which counts the micro-batches
  // either way. `gathers`: a duplicate of `comm` (host communicators only) on which the gathers run on a thread of
  // their own beside compute; without it they run in the calling thread. Collectives add their host time to
  // `comm_seconds`.
  Zero3Params(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, Communicator& comm,
              HostGradient& host, DeviceAdamW* device, double& comm_seconds, std::unique_ptr<Communicator> gathers);

  // Collective: the members of the group acquire the same modules in the same order.
  void acquire(int module, bool grads) override;
  void release(int module) override;
  Tensor weight(const TensorSpec& t) const override;
  Tensor grad(const TensorSpec& t) const override;

  // The ready hook: the module's gradient is complete; it is reduced at the next acquire, once the compute that
  // follows is enqueued, or at the end of the micro-batch.
  void module_ready(int module) { pending_.push_back(module); }
  void after_micro_batch();  // the reductions still pending go out (and land); every module must have been released
  void weights_changed();    // gathered modules hold old weights: they are gathered again where next used

 private:
  // A buffer for one module's gathered weights or its gradient at a time.
  struct ModuleBuffer {
    Allocation mem;
    int module = -1;        // whose values it holds (-1: none)
    int pins = 0;           // weights: acquired and not yet released
    uint64_t last_use = 0;  // weights: when last acquired, for the choice between the blocks' two buffers
    uint64_t ticket = 0;    // weights: its gather on the communication thread, until waited for
  };
  int buffer_for(std::vector<ModuleBuffer>& pool, int module, bool weights) const;  // a free buffer that fits
  static int held(const std::vector<ModuleBuffer>& pool, int module);  // the buffer holding module, or -1
  void gather(int module);            // into a buffer, unless it is there already
  void wait_gather(ModuleBuffer& b);  // its gather on the communication thread is done
  void reduce_module(int module);     // the module's gradient buffer: reduce-scatter, copy out (host) and free
  void flush_reductions();            // issue the reductions of the modules reported ready
  // On the device: the reduced pieces into the gradient shard, their buffers then free. Compute must already wait
  // for the reductions (Backend::compute_after the communicator's stream).
  void accumulate_reduced();

  const ZeroSpec& spec_;
  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& comm_;
  HostGradient& host_;
  DeviceAdamW* const device_;
  double& comm_seconds_;
  std::vector<ModuleBuffer> gathered_, grad_bufs_;
  std::vector<int> pending_;  // reported ready, reduction not yet issued
  std::vector<int> reduced_;  // on the device: reduction issued, its piece not yet accumulated
  uint64_t uses_ = 0;
  std::unique_ptr<comm::CommThread> gather_thread_;
};

}  // namespace yuan
