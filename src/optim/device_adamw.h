// The sharded AdamW of a ZeRO optimizer with its state on the device (optim.offload = none; optim/zero.h): this
// rank's shard of the fp32 master weights and of both moments in the backend's memory (Backend::alloc), updated by
// the backend's adamw op from the reduced gradient, piece by piece where weight decay changes, writing the shard's
// working weights in place. Below zero 3 the reduced gradient is read where the backend holds it (its flat
// gradient buffer), and the updated weights are then all-gathered (gather_bucket) as on the host path. At
// zero 3 the backend holds only the shard's weights and no gradients: Zero3Params accumulates each micro-batch's
// reduced piece of every module into a gradient shard kept here (accumulate), and the gathers that follow read the
// updated shard. Nothing crosses to the host in a step but the norm's scalar.
//
// optim.delayed_update keeps its meaning (optim/zero.h): step t's gradient is set aside (save_gradient) and its
// update runs at the next step's end (update_saved), so the weights of step t reach the backend for step t+2's
// forward, as the host path's thread lands them. On the device the update itself takes a millisecond, so the delay
// buys nothing there but the same numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"
#include "ops/adamw.h"
#include "optim/host_adamw.h"
#include "optim/zero_spec.h"

namespace yuan {

class DeviceAdamW {
 public:
  // The buffers in the one order that the constructor allocates and the memory plan counts them.
  struct Buffers {
    Allocation state;               // device: master | m | v, then the gradient shard (zero 3), then the saved
                                    // gradient (delayed_update)
    HostArray<float> master, m, v;  // host: the state on its way to and from checkpoints (Mem::Comm)
    Buffers(HostBuffers& k, Backend* backend, const ZeroSizes& s);
  };
  // Device bytes of the state of a shard of these sizes.
  static size_t device_bytes(const ZeroSizes& s);

  // The shard of `spec` over the backend's buffers, its initial values from `init`; the weights go to the backend
  // at load_backend().
  DeviceAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, HostBuffers& k,
              const ParamInit& init);

  // The shard's reduced gradient, in shard order: the backend's (below zero 3) or the gradient shard (zero 3).
  Tensor grad() const;
  // Zero 3: `count` reduced values of a micro-batch into the gradient shard from `offset`, on the compute stream
  // (the caller orders it after the reduction): written by the step's first micro-batch, added by later ones.
  void accumulate(const Tensor& reduced, size_t offset, bool first);
  // AdamW over the shard from its reduced gradient, the shard's working weights written as it goes.
  void update(const ops::AdamWHyper& h) { update_from(grad(), h); }
  // delayed_update: the reduced gradient set aside, and later the update from it.
  void save_gradient();
  void update_saved(const ops::AdamWHyper& h) { update_from(saved(), h); }
  // The shard's working weights from master (after a restore: from the host copies first, which the caller wrote
  // through master(), exp_avg() and exp_avg_sq()).
  void load_backend();

  // The state in host memory, for checkpoints: each call copies its tensor down. A caller that writes into them
  // (a restore) calls load_backend() after.
  float* master() { return download(0, buf_.master); }
  float* exp_avg() { return download(1, buf_.m); }
  float* exp_avg_sq() { return download(2, buf_.v); }
  int64_t step() const { return t_; }
  void set_step(int64_t t) { t_ = t; }
  int64_t next_step() { return ++t_; }

 private:
  // State tensor k: 0 master, 1 m, 2 v, then the gradient shard (zero 3) and the saved gradient (delayed_update).
  Tensor part(int k, size_t offset, size_t count) const;
  Tensor saved() const { return part(spec_.cfg.zero.shards_weights() ? 4 : 3, 0, spec_.shard_n); }
  void update_from(const Tensor& g, const ops::AdamWHyper& h);
  float* download(int k, HostArray<float>& host);

  const ZeroSpec& spec_;
  Backend& backend_;
  Buffers buf_;
  std::vector<DecaySegment> segments_;  // the shard's pieces cut where weight decay changes, offsets in the shard
  bool host_copies_out_ = false;        // master() and the others were handed out since load_backend()
  int64_t t_ = 0;
};

}  // namespace yuan
