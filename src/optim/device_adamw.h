// The sharded AdamW of a ZeRO optimizer with its state on the device (optim.offload = none; optim/zero.h): this
// rank's shard of the fp32 master weights and of both moments in the backend's memory (Backend::alloc), updated by
// the backend's adamw op straight from the reduced gradient in the backend's own buffer, which writes the shard's
// working weights in place; at zero 1 and 2 the updated weights are then all-gathered (gather_bucket) as on
// the host path. Nothing crosses to the host in a step but the norm's scalar. Below zero 3 only: the shard is one
// run of the backend's flat buffer.
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
    Allocation state;                       // device: master | m | v, then the saved gradient (delayed_update)
    HostArray<float> master, m, v;          // host: the state on its way to and from checkpoints (Mem::Comm)
    Buffers(HostBuffers& k, Backend* backend, const ZeroSizes& s);
  };
  // Device bytes of the state of a shard of these sizes.
  static size_t device_bytes(const ZeroSizes& s);

  // The shard of `spec` over the backend's buffers, its initial values from `init`; the weights go to the backend
  // at load_backend().
  DeviceAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, HostBuffers& k,
              const ParamInit& init);

  // AdamW over the shard from the backend's reduced gradient, the shard's working weights written as it goes.
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
  Tensor part(int k, size_t offset, size_t count) const;  // state tensor k (0 master, 1 m, 2 v, 3 saved gradient)
  Tensor grad() const;
  Tensor saved() const { return part(3, 0, spec_.shard_n); }
  void update_from(const Tensor& g, const ops::AdamWHyper& h);
  float* download(int k, HostArray<float>& host);

  const ZeroSpec& spec_;
  Backend& backend_;
  Buffers buf_;
  std::vector<DecaySegment> segments_;  // the shard cut where weight decay changes, offsets in the shard
  bool host_copies_out_ = false;        // master() and the others were handed out since load_backend()
  int64_t t_ = 0;
};

}  // namespace yuan
