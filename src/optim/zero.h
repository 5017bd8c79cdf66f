// ZeRO data-parallel AdamW. The fp32 master weights and the AdamW moments live in host memory, sharded over
// the data-parallel ranks; the backend keeps the working weights and gradients (see backend/backend.h).
//
//   zero 0: gradients all-reduced, every rank holds and updates the whole optimizer state.
//   zero 1: gradients reduce-scattered at the end of the step; rank r holds and updates shard r of the
//           master weights and moments (1/N of the bytes), then the weights are all-gathered.
//   zero 2: as 1, but each finished bucket is reduce-scattered during backward of every micro-batch and
//           accumulated into an fp32 gradient shard, so no rank keeps a full gradient across micro-batches.
//
// The flat buffer is padded to a multiple of the world size; rank r's shard is [r*S, (r+1)*S), S = padded/N.
// Communication goes bucket by bucket (optim.bucket_mb, whole modules in reverse layout order, the order
// backward finishes them). Clipping uses the exact global norm: squared norms of the shards, summed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "dist/communicator.h"
#include "util/memory.h"

namespace yuan {

size_t zero_padded_size(size_t n_params, int world);
// Host bytes of optimizer state per rank: fp32 master weights, both moments and the fp32 gradient, for this
// rank's shard (the whole padded buffer at zero 0). Exactly what a ZeroOptimizer allocates as Mem::Optimizer.
size_t zero_optimizer_bytes(size_t n_params, int world, int stage);

struct ZeroStepStats {
  double grad_norm = 0;      // global L2 norm before clipping
  double comm_seconds = 0;   // time in collectives during step() (stage 2: plus during backward)
  double optim_seconds = 0;  // time in the AdamW update
  bool skipped = false;      // no update: the norm was not finite, or the caller asked to skip
};

class ZeroOptimizer {
 public:
  // `init_params`: full fp32 parameters (layout().total() values, identical on every rank). Keeps this rank's
  // shard as the master copy and loads the backend's working weights.
  ZeroOptimizer(const OptimConfig& cfg, Backend& backend, Communicator& comm, const float* init_params);
  ZeroOptimizer(const ZeroOptimizer&) = delete;  // the ready hook captures `this`
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Pass as Backend::forward_backward's `ready` hook.
  const ModuleReadyFn& ready_hook() const { return ready_; }
  // After every micro-batch's forward_backward.
  void after_micro_batch();
  // Reduce the gradients, clip to optim.grad_clip, AdamW with learning rate `lr` on this rank's shard, put the
  // new weights into the backend (all-gathered for zero >= 1), zero the gradients. With `skip` (a non-finite
  // loss) or a non-finite gradient norm, the gradients are dropped and weights and moments stay as they were.
  ZeroStepStats step(double lr, bool skip = false);

  int stage() const;
  size_t shard_offset() const;
  size_t shard_size() const;
  // Optimizer state of this rank's shard (shard_size() values each), for checkpoints.
  float* master();
  float* exp_avg();
  float* exp_avg_sq();
  int64_t adam_step() const;
  void set_adam_step(int64_t s);
  // After master() was overwritten (checkpoint restore): push it into the backend's working weights.
  void load_backend_params();

 private:
  struct Bucket {
    size_t offset = 0, count = 0;  // range of the padded flat buffer
    int first_module = 0, last_module = 0;
    int pending = 0;               // modules not yet finished in the current micro-batch
  };
  struct Segment {
    size_t offset = 0, count = 0;  // range of this rank's shard
    bool decay = false;            // weight decay applies (matrices and embeddings)
  };
  void module_ready(int module);
  void reduce_bucket(const Bucket& b);  // reduce-scatter b, add this rank's part to grad_, zero b in the backend
  std::vector<size_t> shard_counts(const Bucket& b) const;  // b's intersection with each rank's shard
  OptimConfig cfg_;
  Backend& backend_;
  Communicator& comm_;
  ModuleReadyFn ready_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_module_;
  std::vector<bool> module_done_;  // reported ready in the current micro-batch
  std::vector<Segment> segments_;
  size_t padded_ = 0, shard_off_ = 0, shard_n_ = 0;
  HostArray<float> master_, m_, v_, grad_;  // grad_: fp32 gradient of the shard (full for zero 0)
  HostArray<float> staging_;               // zero 2: one bucket's shard part on its way into grad_
  int64_t t_ = 0;
  double comm_seconds_ = 0;
};

}  // namespace yuan
