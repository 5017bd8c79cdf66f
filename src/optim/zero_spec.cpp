#include "optim/zero_spec.h"

#include <algorithm>

#include "util/error.h"

namespace yuan {

Shard zero_shard(size_t n, int ranks, int rank, ZeroStage stage) {
  if (!stage.shards_optimizer_state()) return {0, n};
  const size_t stride = (n + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const size_t lo = std::min(n, static_cast<size_t>(rank) * stride), hi = std::min(n, lo + stride);
  return {lo, hi - lo};
}

static ModuleRange whole(const ParamLayout& layout, ModuleRange modules) {
  return modules.size() ? modules : ModuleRange{layout.modules().front().index, layout.modules().back().index + 1};
}

size_t zero_shard_elements(const ParamLayout& layout, ModuleRange modules, int ranks, int rank, ZeroStage stage) {
  modules = whole(layout, modules);
  size_t n = 0;
  if (!stage.shards_weights()) {
    for (int m = modules.first; m < modules.end; m++) n += layout.module(m).numel;
    return zero_shard(n, ranks, rank, stage).count;
  }
  for (int m = modules.first; m < modules.end; m++)
    n += zero_shard(layout.module(m).numel, ranks, rank, stage).count;
  return n;
}

std::vector<ModuleRange> zero_buckets(const ParamLayout& layout, ModuleRange modules, const OptimConfig& o) {
  modules = whole(layout, modules);
  const double limit = o.zero.shards_weights() ? 0 : o.bucket_mb * 1048576.0;
  std::vector<ModuleRange> out;
  double bytes = 0;
  int end = modules.end;
  for (int i = modules.end - 1; i >= modules.first; i--) {
    bytes += static_cast<double>(layout.module(i).numel * sizeof(float));
    if (bytes < limit && i > modules.first) continue;
    out.push_back({i, end});
    end = i;
    bytes = 0;
  }
  return out;
}

HostArray<float> HostBuffers::array(size_t n, Mem cat) {
  bytes_[static_cast<int>(cat)] += n * sizeof(float);
  return backend_ ? HostArray<float>(n, cat) : HostArray<float>();
}

Allocation HostBuffers::transfer(size_t bytes, Mem cat) {
  bytes_[static_cast<int>(cat)] += bytes;
  return backend_ ? backend_->alloc_transfer(bytes, cat) : Allocation();
}

ZeroSpec::ZeroSpec(const ParamLayout& layout, ModuleRange mods, const OptimConfig& c, int n_ranks, int my_rank,
                   bool overlap_, DType weights)
    : cfg(c), modules(whole(layout, mods)), ranks(n_ranks), rank(my_rank), overlap(overlap_),
      per_micro(c.zero.shards_gradients() && overlap_ && (c.zero.shards_weights() || !optimizer_on_device(c))),
      bf16(weights == DType::BF16), device(optimizer_on_device(c)) {
  // The range: whole modules, one after the other in the backend's buffer.
  range_off = layout.module(modules.first).offset;
  for (int m = modules.first; m < modules.end; m++) {
    const ModuleSpec& spec = layout.module(m);
    YUAN_CHECK(spec.offset == range_off + range_n, "ZeroOptimizer: modules [%d, %d) are not contiguous in the "
               "backend's layout", modules.first, modules.end);
    range_n += spec.numel;
  }
  if (!cfg.zero.shards_weights()) {
    const Shard mine = zero_shard(range_n, ranks, rank, cfg.zero);
    stride = zero_shard(range_n, ranks, 0, cfg.zero).count;
    shard_off = range_off + mine.offset;
    shard_n = mine.count;
    pieces.push_back({shard_off, 0, shard_n});
  } else {
    // Each module cut over the group on its own; the backend's flat weights are the pieces one after the other.
    piece_of_module.assign(static_cast<size_t>(module_count(layout.config())), -1);
    for (int m = modules.first; m < modules.end; m++) {
      const Shard mine = zero_shard(layout.module(m).numel, ranks, rank, cfg.zero);
      piece_of_module[m] = static_cast<int>(pieces.size());
      pieces.push_back({layout.module(m).offset + mine.offset, shard_n, mine.count});
      shard_n += mine.count;
    }
  }
  size_t largest = 0;
  for (const ModuleRange& r : zero_buckets(layout, modules, cfg)) {
    ZeroBucket b;
    b.modules = r;
    b.offset = layout.module(r.first).offset;
    b.count = layout.module(r.end - 1).offset + layout.module(r.end - 1).numel - b.offset;
    largest = std::max(largest, b.count);
    buckets.push_back(b);
  }
  tile = std::min(shard_n, largest);
}

size_t ZeroSpec::rank_offset(int r) const { return range_off + std::min(range_n, static_cast<size_t>(r) * stride); }

std::vector<size_t> ZeroSpec::shard_counts(const ZeroBucket& b) const {
  std::vector<size_t> counts(static_cast<size_t>(ranks), 0);
  if (!cfg.zero.shards_optimizer_state()) return counts;
  for (int r = 0; r < ranks; r++) {
    const size_t lo = std::max(b.offset, rank_offset(r)), hi = std::min(b.offset + b.count, rank_offset(r + 1));
    if (hi > lo) counts[r] = hi - lo;
  }
  return counts;
}

std::vector<size_t> ZeroSpec::module_counts(size_t numel) const {
  std::vector<size_t> counts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; r++) counts[r] = zero_shard(numel, ranks, r, cfg.zero).count;
  return counts;
}

}  // namespace yuan
