#include "optim/grad_buckets.h"

#include <algorithm>

#include "ops/adamw.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {

HostGradient::Buffers::Buffers(HostBuffers& k, const ZeroSizes& s) {
  if (s.device) return;  // the AdamW reads the reduced gradient where the backend holds it
  for (int i = 0; i < (s.delayed ? 2 : 1); i++) grad[i] = k.transfer(s.shard * sizeof(float), Mem::Optimizer);
  if (s.per_micro) incoming = k.transfer(s.shard * sizeof(float), Mem::Comm);
}

// On the device (zero 3) the micro-batches accumulate there (Zero3Params): nothing lands here to be added.
HostGradient::HostGradient(HostBuffers& k, const ZeroSizes& s)
    : n_(s.shard), per_micro_(s.per_micro && !s.device), buf_(k, s) {}

void HostGradient::end_micro_batch() {
  if (per_micro_ && micro_ > 0) ops::add(buf_.grad[cur_].as<float>(), buf_.incoming.as<float>(), n_);
  micro_++;
}

GradientBuckets::GradientBuckets(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend,
                                 Communicator& comm, HostGradient& host, double& comm_seconds)
    : spec_(spec), layout_(layout), backend_(backend), comm_(comm), host_(host), comm_seconds_(comm_seconds),
      in_backward_(spec.per_micro) {
  const size_t n_all = static_cast<size_t>(module_count(layout.config()));
  bucket_of_module_.assign(n_all, -1);
  module_done_.assign(n_all, false);
  for (const ZeroBucket& r : spec.buckets) {
    for (int m = r.modules.first; m < r.modules.end; m++) bucket_of_module_[m] = static_cast<int>(buckets_.size());
    buckets_.push_back({r, r.modules.size(), false});
  }
}

void GradientBuckets::module_ready(int module) {
  const ModuleRange& mods = spec_.modules;
  YUAN_CHECK(mods.contains(module), "ready hook: module %d outside this optimizer's modules [%d, %d)", module,
             mods.first, mods.end);
  YUAN_CHECK(!module_done_[module], "ready hook: module %s reported twice in one micro-batch",
             layout_.module(module).name.c_str());
  module_done_[module] = true;
  if (spec_.cfg.zero.shards_weights()) return;  // reduced module by module (optim/zero3_params.h)
  Bucket& b = buckets_[bucket_of_module_[module]];
  if (--b.pending == 0 && in_backward_) reduce_bucket(b);
}

void GradientBuckets::after_micro_batch() {
  for (int m = spec_.modules.first; m < spec_.modules.end; m++)
    YUAN_CHECK(module_done_[m], "backend %s finished a micro-batch without reporting module %s ready",
               backend_.name(), layout_.module(m).name.c_str());
  module_done_.assign(module_done_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.range.modules.size();
  if (spec_.per_micro) {
    finish();
    for (Bucket& b : buckets_) b.reduced = false;
  }
  host_.end_micro_batch();
}

void GradientBuckets::reduce() {
  for (bool done : module_done_)
    YUAN_CHECK(!done, "ZeroOptimizer: gradients reduced inside a micro-batch (after_micro_batch not called after "
               "its backward)");
  // The host gradient holds only what this step's micro-batches wrote (see HostGradient::target).
  YUAN_CHECK(host_.micro_batches() > 0, "ZeroOptimizer: no micro-batch since the last step");
  if (!spec_.per_micro) {
    for (Bucket& b : buckets_)
      if (!b.reduced) reduce_bucket(b);
    finish();
    for (Bucket& b : buckets_) b.reduced = false;
  }  // zero 2 and 3: reduced and accumulated micro-batch by micro-batch
  host_.end_step();
  in_backward_ = spec_.per_micro;
}

void GradientBuckets::reduce_bucket(Bucket& b) {
  const Tensor g = backend_.grads().elements(b.range.offset, b.range.count);
  const double t0 = now_seconds();
  size_t lo = b.range.offset, hi = b.range.offset + b.range.count;
  if (!spec_.cfg.zero.shards_optimizer_state()) {
    comm_.all_reduce(g.data, b.range.count, g.dtype, ReduceOp::Sum);
  } else {
    comm_.reduce_scatter(g.data, spec_.shard_counts(b.range), g.dtype);
    lo = std::max(lo, spec_.shard_off);
    hi = std::min(hi, spec_.shard_off + spec_.shard_n);
  }
  comm_seconds_ += now_seconds() - t0;
  if (hi > lo && !spec_.device)
    backend_.grads_to_host_async(lo, hi - lo, host_.target() + (lo - spec_.shard_off), comm_.stream());
  b.reduced = true;
}

void GradientBuckets::finish() {
  const double t0 = now_seconds();
  comm_.synchronize();
  backend_.wait_transfers();
  const double waited = now_seconds() - t0;
  comm_seconds_ += waited;
  transfer_wait_ += waited;
  // Zero 3's module buffers are zeroed as they are taken; on the device the AdamW reads them first
  // (ZeroOptimizer::step zeroes them after).
  if (!spec_.cfg.zero.shards_weights() && !spec_.device) backend_.zero_grads(spec_.range_off, spec_.range_n);
}

double GradientBuckets::norm_share(const Tensor& device_grad) const {
  // At zero 0 every member holds the whole gradient: one of them speaks for the group. With tensor parallelism
  // every tensor rank holds the replicated tensors whole (LayerNorms, the row-parallel layers' biases, wpe):
  // tensor rank 0 counts them, the others only their own parts.
  const TensorParallel& tp = layout_.tp();
  // The sum of squares of the reduced gradient's n values from `off` in the shard, on the host or the device.
  const auto sum_squares = [&](size_t off, size_t n) {
    if (n == 0) return 0.0;
    if (!spec_.device) return ops::sum_squares(host_.current() + off, n);
    return backend_.ops().sum_squares(device_grad.elements(off, n));
  };
  if (!spec_.cfg.zero.shards_optimizer_state() && comm_.rank() != 0) return 0;
  if (tp.size == 1 || tp.rank == 0) return sum_squares(0, spec_.shard_n);
  double share = 0;
  for (const TensorSpec& t : layout_.tensors()) {
    if (t.split == TpSplit::Replicated) continue;
    for (const ZeroSpec::Piece& p : spec_.pieces) {
      const size_t lo = std::max(t.offset, p.layout), hi = std::min(t.offset + t.numel, p.layout + p.count);
      if (lo < hi) share += sum_squares(p.host + (lo - p.layout), hi - lo);
    }
  }
  return share;
}

}  // namespace yuan
