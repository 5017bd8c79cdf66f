// The gradient half of a ZeRO optimizer (optim/zero.h): where this rank's part of the reduced gradient lands on
// the host (HostGradient), and the buckets that take it there (GradientBuckets).
//
// Per bucket: reduce (all-reduce at zero 0, reduce-scatter above, on the communicator's stream for NCCL), then this
// rank's part copied into the host gradient (Backend::grads_to_host_async into transfer memory, on a copy stream).
// At zero 2 and 3 with overlap the buckets go during every backward, and micro-batches after the first land in a
// second buffer that is added into the gradient when they are done, so no rank keeps a whole gradient across
// micro-batches; at zero 0 and 1 they go during the step's last backward when the caller announces it
// (before_last_micro_batch), else all at once in reduce(). Zero 3 reduces module by module (optim/zero3_params.h):
// here its modules are only checked off. With the optimizer on the device (ZeroSpec::device) nothing goes to the
// host: the reduced shard stays in the backend's gradient buffer (at zero 3 it is accumulated into the device
// AdamW's gradient shard), where the device AdamW reads it.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "optim/zero_spec.h"

namespace yuan {

// The fp32 gradient of this rank's shard on the host (the whole range at zero 0), as the step's micro-batches
// write it. With delayed_update two of them: backward fills one while the update reads the other. With the state
// on the device it holds nothing and only counts the micro-batches.
class HostGradient {
 public:
  // The buffers in the one order that the constructor allocates and the memory plan counts them.
  struct Buffers {
    Allocation grad[2];   // the gradient; the second for delayed_update (Mem::Optimizer)
    Allocation incoming;  // zero 2 and 3: a later micro-batch's reduced part, added into grad (Mem::Comm)
    Buffers(HostBuffers& k, const ZeroSizes& s);
  };
  HostGradient(HostBuffers& k, const ZeroSizes& s);

  // Where the reduced parts of the current micro-batch go: the gradient for the step's first micro-batch (nothing
  // on the host is zeroed: the reductions write every element), the incoming buffer for later ones.
  float* target() { return (per_micro_ && micro_ > 0 ? buf_.incoming : buf_.grad[cur_]).as<float>(); }
  const float* current() const { return buf_.grad[cur_].as<float>(); }  // what the step updates from
  size_t size() const { return n_; }
  // After a micro-batch's reductions have landed: a later one's is added into the gradient.
  void end_micro_batch();
  int micro_batches() const { return micro_; }  // since the step's reduction
  void end_step() { micro_ = 0; }
  // delayed_update: the update now owns current(); backward fills the other buffer.
  void swap() { cur_ ^= 1; }

 private:
  size_t n_;
  bool per_micro_;
  Buffers buf_;
  int cur_ = 0;    // the buffer backward fills
  int micro_ = 0;  // micro-batches finished since the last step
};

class GradientBuckets {
 public:
  // The buckets of `spec` over the backend's flat gradients, reduced over `comm` into `host`; the host time spent in
  // collectives and copies is added to `comm_seconds`.
  GradientBuckets(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, Communicator& comm,
                  HostGradient& host, double& comm_seconds);
  // The ready hook's work: `module`'s gradient is complete in this micro-batch. A bucket whose modules all are is
  // reduced now when the reductions go during backward.
  void module_ready(int module);
  // Zero 0 and 1: reduce each bucket as backward finishes it in the step's last micro-batch.
  void before_last_micro_batch() { in_backward_ = spec_.overlap; }
  // After a micro-batch's backward: every module must have been reported; at zero 2 and 3 its reductions land.
  void after_micro_batch();
  // After the step's last micro-batch: the reductions not yet done, and the backend's gradients zeroed.
  void reduce();
  // This rank's share of the squared global norm of the reduced gradient (the world's shares sum to it): of the
  // host gradient, or with the state on the device of `device_grad`, the shard's reduced gradient in shard order.
  double norm_share(const Tensor& device_grad) const;
  // The host seconds spent waiting for reductions and copies to land since the previous call (in comm_seconds too).
  double take_transfer_wait() { return std::exchange(transfer_wait_, 0.0); }

 private:
  struct Bucket {
    ZeroBucket range;
    int pending = 0;       // modules not yet finished in the current micro-batch
    bool reduced = false;  // reduced and on its way to the host in the current micro-batch / step
  };
  void reduce_bucket(Bucket& b);  // reduce b; start copying this rank's part into the host gradient
  void finish();                  // wait for the reductions; zero the backend's gradients

  const ZeroSpec& spec_;
  const ParamLayout& layout_;
  Backend& backend_;
  Communicator& comm_;
  HostGradient& host_;
  double& comm_seconds_;
  double transfer_wait_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_module_;  // by module index; -1 outside the range
  std::vector<bool> module_done_;      // by module index: reported ready in the current micro-batch
  bool in_backward_;                   // reduce buckets as backward completes them
};

}  // namespace yuan
