#include "optim/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dist/world.h"
#include "ops/adamw.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {

size_t zero_padded_size(size_t n_params, int world) {
  const size_t w = static_cast<size_t>(world);
  return (n_params + w - 1) / w * w;
}

static size_t shard_elements(size_t n_params, int world, int stage) {
  size_t padded = zero_padded_size(n_params, world);
  return stage == 0 ? padded : padded / static_cast<size_t>(world);
}

size_t zero_optimizer_bytes(size_t n_params, int world, int stage) {
  return 4 * shard_elements(n_params, world, stage) * sizeof(float);  // master, m, v, grad
}

static char* at(const DeviceBuffer& b, size_t offset) { return static_cast<char*>(b.ptr) + offset * dtype_size(b.dtype); }

ZeroOptimizer::ZeroOptimizer(const OptimConfig& cfg, Backend& backend, Communicator& comm, const float* init_params)
    : cfg_(cfg), backend_(backend), comm_(comm) {
  YUAN_CHECK(cfg.zero >= 0 && cfg.zero <= 2, "optim.zero = %d: must be 0, 1 or 2", cfg.zero);
  const ParamLayout& layout = backend.layout();
  const int world = comm.size();
  padded_ = zero_padded_size(layout.total(), world);
  YUAN_CHECK(backend.padded_size() == padded_, "backend %s holds %zu parameters, ZeRO over %d ranks needs %zu",
             backend.name(), backend.padded_size(), world, padded_);
  shard_n_ = shard_elements(layout.total(), world, cfg.zero);
  shard_off_ = cfg.zero == 0 ? 0 : static_cast<size_t>(comm.rank()) * shard_n_;

  // Buckets of whole modules, last module first (the order backward finishes them); the padding tail rides with
  // ln_f so that the buckets tile the padded buffer.
  const std::vector<ModuleSpec>& mods = layout.modules();
  const int n_mod = static_cast<int>(mods.size());
  bucket_of_module_.assign(mods.size(), 0);
  module_done_.assign(mods.size(), false);
  const double limit = cfg.bucket_mb * 1048576.0;
  double bytes = 0;
  int last = n_mod - 1;
  for (int i = n_mod - 1; i >= 0; i--) {
    bytes += static_cast<double>(mods[i].numel * sizeof(float));
    bucket_of_module_[i] = static_cast<int>(buckets_.size());
    if (bytes < limit && i > 0) continue;
    Bucket b;
    b.first_module = i;
    b.last_module = last;
    b.offset = mods[i].offset;
    b.count = (last == n_mod - 1 ? padded_ : mods[last].offset + mods[last].numel) - b.offset;
    b.pending = last - i + 1;
    buckets_.push_back(b);
    last = i - 1;
    bytes = 0;
  }

  // Weight decay by range: each tensor's part of the shard, neighbours with the same setting merged.
  const size_t lo = shard_off_, hi = shard_off_ + shard_n_;
  auto add_segment = [&](size_t begin, size_t end, bool decay) {
    begin = std::max(begin, lo);
    end = std::min(end, hi);
    if (begin >= end) return;
    if (!segments_.empty() && segments_.back().decay == decay) {
      segments_.back().count += end - begin;
      return;
    }
    segments_.push_back({begin - lo, end - begin, decay});
  };
  for (const TensorSpec& t : layout.tensors()) add_segment(t.offset, t.offset + t.numel, t.decay);
  add_segment(layout.total(), padded_, false);

  master_ = HostArray<float>(shard_n_, Mem::Optimizer);
  m_ = HostArray<float>(shard_n_, Mem::Optimizer);
  v_ = HostArray<float>(shard_n_, Mem::Optimizer);
  grad_ = HostArray<float>(shard_n_, Mem::Optimizer);
  if (cfg.zero == 2) {
    size_t most = 0;
    for (const Bucket& b : buckets_) most = std::max(most, shard_counts(b)[comm.rank()]);
    staging_ = HostArray<float>(most, Mem::Comm);
  }
  if (lo < layout.total()) std::memcpy(master_.data(), init_params + lo, (std::min(hi, layout.total()) - lo) * sizeof(float));
  ready_ = [this](int module) { module_ready(module); };
  load_backend_params();
}

std::vector<size_t> ZeroOptimizer::shard_counts(const Bucket& b) const {
  std::vector<size_t> counts(static_cast<size_t>(comm_.size()), 0);
  if (cfg_.zero == 0) return counts;
  for (size_t r = 0; r < counts.size(); r++) {
    size_t lo = std::max(b.offset, r * shard_n_), hi = std::min(b.offset + b.count, (r + 1) * shard_n_);
    if (hi > lo) counts[r] = hi - lo;
  }
  return counts;
}

void ZeroOptimizer::module_ready(int module) {
  YUAN_CHECK(module >= 0 && static_cast<size_t>(module) < bucket_of_module_.size(),
             "ready hook: module %d outside the %zu modules", module, bucket_of_module_.size());
  YUAN_CHECK(!module_done_[module], "ready hook: module %s reported twice in one micro-batch",
             backend_.layout().modules()[module].name.c_str());
  module_done_[module] = true;
  Bucket& b = buckets_[bucket_of_module_[module]];
  if (--b.pending == 0 && cfg_.zero == 2) reduce_bucket(b);
}

void ZeroOptimizer::after_micro_batch() {
  for (size_t m = 0; m < module_done_.size(); m++)
    YUAN_CHECK(module_done_[m], "backend %s finished a micro-batch without reporting module %s ready",
               backend_.name(), backend_.layout().modules()[m].name.c_str());
  module_done_.assign(module_done_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.last_module - b.first_module + 1;
}

void ZeroOptimizer::reduce_bucket(const Bucket& b) {
  const DeviceBuffer g = backend_.grad_buffer();
  double t0 = now_seconds();
  comm_.reduce_scatter(at(g, b.offset), shard_counts(b), g.dtype);
  comm_seconds_ += now_seconds() - t0;
  const size_t lo = std::max(b.offset, shard_off_), hi = std::min(b.offset + b.count, shard_off_ + shard_n_);
  if (hi > lo) {
    float* dst = grad_.data() + (lo - shard_off_);
    if (cfg_.zero == 1) {
      backend_.grads_to_host(lo, hi - lo, dst);  // zero 1 reduces once per step: every element written once
    } else {
      backend_.grads_to_host(lo, hi - lo, staging_.data());
      const float* src = staging_.data();
      const size_t n = hi - lo;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
      for (size_t i = 0; i < n; i++) dst[i] += src[i];
    }
  }
  backend_.zero_grads(b.offset, b.count);
}

ZeroStepStats ZeroOptimizer::step(double lr, bool skip) {
  for (bool done : module_done_)
    YUAN_CHECK(!done, "ZeroOptimizer::step inside a micro-batch (after_micro_batch not called after forward_backward)");
  ZeroStepStats st;
  if (cfg_.zero == 0) {
    const DeviceBuffer g = backend_.grad_buffer();
    double t0 = now_seconds();
    for (const Bucket& b : buckets_) comm_.all_reduce(at(g, b.offset), b.count, g.dtype, ReduceOp::Sum);
    comm_seconds_ += now_seconds() - t0;
    backend_.grads_to_host(0, padded_, grad_.data());
    backend_.zero_grads(0, padded_);
  } else if (cfg_.zero == 1) {
    for (const Bucket& b : buckets_) reduce_bucket(b);
  }  // zero 2: reduced bucket by bucket during backward

  double t0 = now_seconds();
  double norm2 = ops::sum_squares(grad_.data(), shard_n_);
  double t1 = now_seconds();
  if (cfg_.zero > 0) norm2 = dist::allreduce_sum(norm2);  // the data-parallel group is the whole world
  double t2 = now_seconds();
  comm_seconds_ += t2 - t1;
  st.grad_norm = std::sqrt(norm2);
  if (skip || !std::isfinite(st.grad_norm)) {
    if (cfg_.zero == 2) std::memset(grad_.data(), 0, shard_n_ * sizeof(float));
    st.skipped = true;
    st.comm_seconds = comm_seconds_;
    comm_seconds_ = 0;
    return st;
  }
  ops::AdamWHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.t = ++t_;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  if (cfg_.grad_clip > 0 && st.grad_norm > cfg_.grad_clip) h.grad_scale = cfg_.grad_clip / (st.grad_norm + 1e-6);
  for (const Segment& s : segments_) {
    h.weight_decay = s.decay ? cfg_.weight_decay : 0.0;
    ops::adamw_update(master_.data() + s.offset, m_.data() + s.offset, v_.data() + s.offset,
                      grad_.data() + s.offset, nullptr, s.count, h);
  }
  if (cfg_.zero == 2) std::memset(grad_.data(), 0, shard_n_ * sizeof(float));
  st.optim_seconds = (t1 - t0) + (now_seconds() - t2);

  load_backend_params();
  st.comm_seconds = comm_seconds_;
  comm_seconds_ = 0;
  return st;
}

void ZeroOptimizer::load_backend_params() {
  backend_.set_params(master_.data(), shard_off_, shard_n_);
  if (cfg_.zero == 0) return;
  const DeviceBuffer p = backend_.param_buffer();
  double t0 = now_seconds();
  for (const Bucket& b : buckets_) comm_.all_gather(at(p, b.offset), shard_counts(b), p.dtype);
  comm_seconds_ += now_seconds() - t0;
}

int ZeroOptimizer::stage() const { return cfg_.zero; }
size_t ZeroOptimizer::shard_offset() const { return shard_off_; }
size_t ZeroOptimizer::shard_size() const { return shard_n_; }
float* ZeroOptimizer::master() { return master_.data(); }
float* ZeroOptimizer::exp_avg() { return m_.data(); }
float* ZeroOptimizer::exp_avg_sq() { return v_.data(); }
int64_t ZeroOptimizer::adam_step() const { return t_; }
void ZeroOptimizer::set_adam_step(int64_t s) { t_ = s; }

}  // namespace yuan
