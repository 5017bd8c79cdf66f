// The sharded host AdamW of a ZeRO optimizer (optim/zero.h): this rank's shard of the fp32 master weights and of
// both moments, updated tile by tile (a tile is a bucket's part of the shard, cut where weight decay changes) with
// OpenMP, each finished tile's working weights uploaded into the backend on alternating copy lanes while the next
// tile updates, and at zero 1 and 2 each bucket's updated weights all-gathered over the group while the next bucket
// updates. Buckets go in the order the next forward reads them, so the weights it needs first are the first there,
// and the only transfers the step waits for are the last bucket's upload and gather. With bf16
// working weights AdamW writes them beside the master copy into staging: one tile per lane, or the whole shard when
// the update runs on the delayed-update thread and is uploaded later (upload_shard).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "ops/adamw.h"
#include "optim/zero_spec.h"

namespace yuan {

// The AdamW settings of `o` for step t (from 1) at learning rate lr, with the gradient scaled down to
// o.grad_clip when the global norm exceeds it (torch.nn.utils.clip_grad_norm_). Weight decay is o's: callers
// turn it off where it does not apply (model/gpt.h decay_segments).
ops::AdamWHyper adamw_hyper(const OptimConfig& o, double lr, int64_t t, double grad_norm);

// Where an optimizer takes the initial values of its shard from: a function writing the backend layout's range
// [offset, offset + count) to dst (init_gpt2 on that range, so that no rank holds the whole model at once), or an
// array of the whole layout.
class ParamInit {
 public:
  using Fill = std::function<void(size_t offset, size_t count, float* dst)>;
  explicit ParamInit(Fill fill) : fill_(std::move(fill)) {}
  ParamInit(const float* whole)  // NOLINT(google-explicit-constructor): an array is the common case in tests
      : fill_([whole](size_t offset, size_t count, float* dst) { std::copy_n(whole + offset, count, dst); }) {}
  void operator()(size_t offset, size_t count, float* dst) const { fill_(offset, count, dst); }

 private:
  Fill fill_;
};

// Zero 1 and 2: every rank's updated shard of bucket `b` of the backend's working weights into every rank's
// backend, enqueued over `comm` after the backend's work so far (nothing at zero 0, where each rank updates all of
// it, and at zero 3, which gathers where the weights are used). Both placements of the state publish with it.
void gather_bucket(const ZeroSpec& spec, Backend& backend, Communicator& comm, const ZeroBucket& b);

class HostAdamW {
 public:
  // The buffers in the one order that the constructor allocates and the memory plan counts them.
  struct Buffers {
    HostArray<float> master, m, v;  // Mem::Optimizer
    Allocation stage[2];            // bf16: a tile on its way to the backend, one per copy lane (Mem::Comm)
    Allocation bf16_shard;          // bf16 with delayed_update: the updated shard waiting for its upload (Mem::Comm)
    Buffers(HostBuffers& k, const ZeroSizes& s);
  };
  // The shard of `spec` over the backend's working weights, its initial values from `init`; the weights go to the
  // backend at load_backend().
  HostAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, HostBuffers& k, const ParamInit& init);

  // Called with every bucket of the spec, in forward order (the reverse of spec.buckets), once this rank's part of
  // it has been enqueued for upload (possibly none): at zero 1 and 2 its all-gather goes out there, beside the
  // AdamW of the buckets after it.
  using BucketUploaded = std::function<void(const ZeroBucket&)>;
  // Host seconds of an update: the AdamW itself, and waiting for a staging lane to be free.
  struct UpdateTimes {
    double adamw = 0, lane_wait = 0;
  };
  // AdamW over the shard from its gradient `g`, bucket by bucket in the order the next forward uses the weights, each
  // tile's weights uploaded as it is done (zero 3: into the backend's shard; below: into the shard's place in the
  // backend's weights). Returns with the last uploads in flight: the backend's compute waits for them, and the
  // staging lanes are waited for where they are next filled.
  UpdateTimes update_and_upload(const float* g, const ops::AdamWHyper& h, const BucketUploaded& uploaded);
  // AdamW over the shard without touching the backend (delayed_update: on its thread); upload_shard() follows. It
  // first waits for the previous upload_shard() to have left the bf16 copy (or master).
  void update(const float* g, const ops::AdamWHyper& h);
  // The working weights of the whole shard from master (or its bf16 copy), bucket by bucket as above; returns with
  // the uploads in flight.
  void upload_shard(const BucketUploaded& uploaded);
  void load_backend();  // master into the backend's working weights (the shard's part; ZeroOptimizer::publish the rest)

  float* master() { return buf_.master.data(); }
  float* exp_avg() { return buf_.m.data(); }
  float* exp_avg_sq() { return buf_.v.data(); }
  int64_t step() const { return t_; }  // AdamW steps taken (its bias correction)
  void set_step(int64_t t) { t_ = t; }
  int64_t next_step() { return ++t_; }  // the step an update is about to take

 private:
  struct Tile {
    size_t bucket = 0;                 // its index in spec.buckets
    size_t offset = 0, count = 0;      // a bucket's part of this rank's shard
    size_t backend = 0;                // where it is in the backend's flat weights
    std::vector<DecaySegment> pieces;  // the tile split where weight decay changes, offsets in the shard
  };
  // AdamW over tile `t` from gradient `g` (the shard's); its working weights in bf16 into `bf16` when not null.
  void update_tile(const Tile& t, const float* g, uint16_t* bf16, const ops::AdamWHyper& h);
  // `upload(tile, k)` for each tile, the k-th in forward order, then `uploaded(bucket)`, bucket by bucket.
  void in_forward_order(const std::function<void(const Tile&, size_t)>& upload, const BucketUploaded& uploaded);

  const ZeroSpec& spec_;
  Backend& backend_;
  Buffers buf_;
  std::vector<Tile> tiles_;
  int64_t t_ = 0;
};

}  // namespace yuan
