// What one ZeRO optimizer of a rank is, derived before anything is allocated: this rank's shard of its modules,
// the buckets its gradients are reduced in, and the sizes of its host buffers. The optimizer (optim/zero.h) and
// its units build from a ZeroSpec, and the memory plan (train/memory_plan.h) sums the buffers that the units'
// constructors allocate by walking them with a HostBuffers that only counts: one derivation, one walk.
#pragma once
#include <cstddef>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/gpt.h"
#include "util/memory.h"

namespace yuan {

// Group rank `rank`'s shard of n parameters over `ranks` at ZeRO stage `stage` (everything at stage 0): offset
// and count inside the range.
struct Shard {
  size_t offset = 0, count = 0;
};
Shard zero_shard(size_t n_params, int ranks, int rank, ZeroStage stage);
// Elements of rank `rank`'s shard of `modules` of `layout` (empty: all of them) at `stage`: at zero 3 the sum of
// its block of each module, which is also the size of the backend's flat weights (program/params.h backend_spec).
size_t zero_shard_elements(const ParamLayout& layout, ModuleRange modules, int ranks, int rank, ZeroStage stage);
// The buckets a ZeroOptimizer reduces gradients in: whole modules of `modules` (empty: all of the layout's), about
// o.bucket_mb MiB of fp32 each, last module first (the order backward finishes them); one module each at zero 3.
std::vector<ModuleRange> zero_buckets(const ParamLayout& layout, ModuleRange modules, const OptimConfig& o);

// The host buffers of an optimizer's units, walked by their constructors: with a backend it allocates them, without
// one it only counts their bytes by category (as program/program.cpp's BumpAllocator does for the program).
class HostBuffers {
 public:
  HostBuffers() = default;  // counts
  explicit HostBuffers(Backend& backend) : backend_(&backend) {}
  HostArray<float> array(size_t n, Mem cat);   // zeroed host memory the device never reads
  Allocation transfer(size_t bytes, Mem cat);  // Backend::alloc_transfer: what the device copies to or from
  size_t bytes(Mem cat) const { return bytes_[static_cast<int>(cat)]; }

 private:
  Backend* backend_ = nullptr;
  size_t bytes_[static_cast<int>(Mem::kCount)] = {};
};

// What the sizes of an optimizer's host buffers depend on.
struct ZeroSizes {
  size_t shard = 0;        // elements of this rank's shard
  size_t tile = 0;         // elements a staging lane holds: at least the largest tile
  bool delayed = false;    // optim.delayed_update
  bool per_micro = false;  // reductions land every micro-batch (zero 2 and 3 with overlap)
  bool bf16 = false;       // the working weights are bf16: AdamW writes them for upload
  bool device = false;     // optim.offload = none: the state on the device, its host buffers the checkpoint's
  bool sharded = false;    // zero 3: the backend holds the shard and no gradients (with device: the optimizer
                           // keeps the shard's reduced gradient on the device)
};

// Bucket `modules`: the range [offset, offset + count) of the backend's flat buffer.
struct ZeroBucket {
  ModuleRange modules;
  size_t offset = 0, count = 0;
};

// One optimizer's derivation (above): plain data, computed the same way by the optimizer and by the plan.
struct ZeroSpec {
  // A run of this rank's shard: `count` elements from `layout` in the backend's layout, at `host` in the shard.
  struct Piece {
    size_t layout = 0, host = 0, count = 0;
  };

  // Group rank `rank` of `ranks` over `modules` of `layout` (whole modules, contiguous; empty: all of them), with
  // working weights of type `weights`. `overlap`: see ZeroOptimizer.
  ZeroSpec(const ParamLayout& layout, ModuleRange modules, const OptimConfig& cfg, int ranks, int rank, bool overlap,
           DType weights);

  OptimConfig cfg;
  ModuleRange modules;
  int ranks = 1, rank = 0;
  // device: the master weights and moments on the device (optimizer_on_device). Below zero 3 the backend's
  // gradient buffer is whole anyway, and the AdamW reads the reduced shard there: zero 2 then reduces as zero 1
  // does, in the last micro-batch only. Zero 3 still reduces every micro-batch, into a gradient shard on the device.
  bool overlap = true, per_micro = false, bf16 = false, device = false;
  size_t range_off = 0, range_n = 0;  // the modules' part of the backend's layout
  size_t shard_off = 0, shard_n = 0;  // this rank's shard, in the backend's flat buffer (at zero 3 the backend
                                      // holds the pieces one after the other, from 0)
  size_t stride = 0;                  // S: shard r starts at range_off + r * S (below zero 3)
  std::vector<Piece> pieces;          // the shard in the layout: one piece, or one per module at zero 3
  std::vector<int> piece_of_module;   // zero 3, by module index
  std::vector<ZeroBucket> buckets;    // zero_buckets, last module first
  // A tile is a bucket's part of the shard: at most the largest bucket and at most the shard.
  size_t tile = 0;

  size_t rank_offset(int r) const;  // start of group rank r's shard in the backend's buffer (below zero 3)
  // The bucket's intersection with each rank's shard (below zero 3; all zero at zero 0, which all-reduces).
  std::vector<size_t> shard_counts(const ZeroBucket& b) const;
  // Each rank's block of a module of `numel` elements (zero 3).
  std::vector<size_t> module_counts(size_t numel) const;
  ZeroSizes sizes() const {
    return {shard_n, tile, cfg.delayed_update, per_micro, bf16, device, cfg.zero.shards_weights()};
  }
};

}  // namespace yuan
