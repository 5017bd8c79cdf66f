#include "optim/zero.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/log.h"

namespace yuan {

Shard zero_shard(size_t n, int ranks, int rank, int stage) {
  if (stage == 0) return {0, n};
  const size_t stride = (n + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const size_t lo = std::min(n, static_cast<size_t>(rank) * stride), hi = std::min(n, lo + stride);
  return {lo, hi - lo};
}

size_t zero_optimizer_bytes(size_t n_params, int ranks, int rank, int stage, bool delayed_update) {
  // master, m, v, gradient(s)
  return (delayed_update ? 5 : 4) * zero_shard(n_params, ranks, rank, stage).count * sizeof(float);
}

ops::AdamWHyper adamw_hyper(const OptimConfig& o, double lr, int64_t t, double grad_norm) {
  ops::AdamWHyper h;
  h.lr = lr;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.t = t;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  if (o.grad_clip > 0 && grad_norm > o.grad_clip) h.grad_scale = o.grad_clip / (grad_norm + 1e-6);
  return h;
}

std::vector<DecaySegment> decay_segments(const ParamLayout& layout, size_t lo, size_t hi) {
  std::vector<DecaySegment> out;
  auto add = [&](size_t begin, size_t end, bool decay) {
    begin = std::max(begin, lo);
    end = std::min(end, hi);
    if (begin >= end) return;
    if (!out.empty() && out.back().decay == decay) {
      out.back().count += end - begin;
      return;
    }
    out.push_back({begin, end - begin, decay});
  };
  for (const TensorSpec& t : layout.tensors()) add(t.offset, t.offset + t.numel, t.decay);
  return out;
}

static char* at(const Tensor& flat, size_t offset) {
  return static_cast<char*>(flat.data) + offset * dtype_size(flat.dtype);
}

ZeroOptimizer::ZeroOptimizer(const OptimConfig& cfg, Backend& backend, Communicator& comm, const float* init_params,
                             ModuleRange modules, bool overlap)
    : cfg_(cfg), backend_(backend), comm_(comm), overlap_(overlap), per_micro_(cfg.zero == 2 && overlap) {
  YUAN_CHECK(cfg.zero >= 0 && cfg.zero <= 2, "optim.zero = %d: must be 0, 1 or 2", cfg.zero);
  const ParamLayout& layout = backend.layout();
  if (modules.size() == 0) modules = {layout.modules().front().index, layout.modules().back().index + 1};
  modules_ = modules;
  const DType wdt = backend.weights().dtype;
  YUAN_CHECK(wdt == DType::F32 || wdt == DType::BF16, "backend %s: working weights must be f32 or bf16",
             backend.name());
  bf16_ = wdt == DType::BF16;

  // The range: whole modules, one after the other in the backend's buffer.
  range_off_ = layout.module(modules.first).offset;
  for (int m = modules.first; m < modules.end; m++) {
    const ModuleSpec& spec = layout.module(m);
    YUAN_CHECK(spec.offset == range_off_ + range_n_, "ZeroOptimizer: modules [%d, %d) are not contiguous in the "
               "backend's layout", modules.first, modules.end);
    range_n_ += spec.numel;
  }
  // The model as this tensor rank holds it: every module, each tensor its part of (the whole model without tensor
  // parallelism). Checkpoints place shards there.
  global_off_ = ParamLayout(layout.config(), held_modules(layout.config(), all_modules(layout.config())),
                            layout.tp()).module(modules.first).offset;
  const Shard mine = zero_shard(range_n_, comm.size(), comm.rank(), cfg.zero);
  stride_ = zero_shard(range_n_, comm.size(), 0, cfg.zero).count;
  shard_off_ = range_off_ + mine.offset;
  shard_n_ = mine.count;

  // Buckets of whole modules, last module first (the order backward finishes them).
  const int n_all = module_count(layout.config());
  bucket_of_module_.assign(static_cast<size_t>(n_all), -1);
  module_done_.assign(static_cast<size_t>(n_all), false);
  const double limit = cfg.bucket_mb * 1048576.0;
  double bytes = 0;
  int last = modules.end - 1;
  for (int i = modules.end - 1; i >= modules.first; i--) {
    bytes += static_cast<double>(layout.module(i).numel * sizeof(float));
    bucket_of_module_[i] = static_cast<int>(buckets_.size());
    if (bytes < limit && i > modules.first) continue;
    Bucket b;
    b.first_module = i;
    b.last_module = last;
    b.offset = layout.module(i).offset;
    b.count = layout.module(last).offset + layout.module(last).numel - b.offset;
    b.pending = last - i + 1;
    buckets_.push_back(b);
    last = i - 1;
    bytes = 0;
  }

  // Tiles: the buckets' parts of the shard, which tile it, each cut where weight decay changes.
  const size_t lo = shard_off_, hi = shard_off_ + shard_n_;
  size_t largest = 0;
  for (const Bucket& b : buckets_) {
    const size_t tlo = std::max(b.offset, lo), thi = std::min(b.offset + b.count, hi);
    if (tlo >= thi) continue;
    Tile t;
    t.offset = tlo - lo;
    t.count = thi - tlo;
    t.pieces = decay_segments(layout, tlo, thi);
    for (DecaySegment& p : t.pieces) p.offset -= lo;
    largest = std::max(largest, t.count);
    tiles_.push_back(std::move(t));
  }

  master_ = HostArray<float>(shard_n_, Mem::Optimizer);
  m_ = HostArray<float>(shard_n_, Mem::Optimizer);
  v_ = HostArray<float>(shard_n_, Mem::Optimizer);
  for (int i = 0; i < (cfg.delayed_update ? 2 : 1); i++)
    grad_[i] = backend.alloc_transfer(shard_n_ * sizeof(float), Mem::Optimizer);
  if (per_micro_) incoming_ = backend.alloc_transfer(shard_n_ * sizeof(float), Mem::Comm);
  if (bf16_ && cfg.delayed_update) bf16_shard_ = backend.alloc_transfer(shard_n_ * sizeof(uint16_t), Mem::Comm);
  if (bf16_ && !cfg.delayed_update)
    for (Allocation& s : stage_) s = backend.alloc_transfer(largest * sizeof(uint16_t), Mem::Comm);
  if (shard_n_) std::memcpy(master_.data(), init_params + shard_off_, shard_n_ * sizeof(float));
  reduce_in_backward_ = per_micro_;
  ready_ = [this](int module) { module_ready(module); };
  load_backend_params();
}

ZeroOptimizer::~ZeroOptimizer() {
  if (worker_.joinable()) worker_.join();
}

size_t ZeroOptimizer::rank_offset(int r) const {
  return range_off_ + std::min(range_n_, static_cast<size_t>(r) * stride_);
}

std::vector<size_t> ZeroOptimizer::shard_counts(const Bucket& b) const {
  std::vector<size_t> counts(static_cast<size_t>(comm_.size()), 0);
  if (cfg_.zero == 0) return counts;
  for (int r = 0; r < comm_.size(); r++) {
    const size_t lo = std::max(b.offset, rank_offset(r)), hi = std::min(b.offset + b.count, rank_offset(r + 1));
    if (hi > lo) counts[r] = hi - lo;
  }
  return counts;
}

void ZeroOptimizer::module_ready(int module) {
  YUAN_CHECK(modules_.contains(module), "ready hook: module %d outside this optimizer's modules [%d, %d)", module,
             modules_.first, modules_.end);
  YUAN_CHECK(!module_done_[module], "ready hook: module %s reported twice in one micro-batch",
             backend_.layout().module(module).name.c_str());
  module_done_[module] = true;
  Bucket& b = buckets_[bucket_of_module_[module]];
  if (--b.pending == 0 && reduce_in_backward_) reduce_bucket(b);
}

void ZeroOptimizer::before_last_micro_batch() { reduce_in_backward_ = overlap_; }

void ZeroOptimizer::after_micro_batch() {
  for (int m = modules_.first; m < modules_.end; m++)
    YUAN_CHECK(module_done_[m], "backend %s finished a micro-batch without reporting module %s ready",
               backend_.name(), backend_.layout().module(m).name.c_str());
  module_done_.assign(module_done_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.last_module - b.first_module + 1;
  if (per_micro_) {
    finish_reductions(micro_ > 0);
    for (Bucket& b : buckets_) b.reduced = false;
  }
  micro_++;
}

// The first micro-batch of a step writes the host gradient, later ones (zero 2) are added to it: nothing on the
// host has to be zeroed, and every element of the shard is written since the buckets tile the buffer.
void ZeroOptimizer::reduce_bucket(Bucket& b) {
  const Tensor& g = backend_.grads();
  const double t0 = now_seconds();
  size_t lo = b.offset, hi = b.offset + b.count;
  if (cfg_.zero == 0) {
    comm_.all_reduce(at(g, b.offset), b.count, g.dtype, ReduceOp::Sum);
  } else {
    comm_.reduce_scatter(at(g, b.offset), shard_counts(b), g.dtype);
    lo = std::max(lo, shard_off_);
    hi = std::min(hi, shard_off_ + shard_n_);
  }
  comm_seconds_ += now_seconds() - t0;
  if (hi > lo) {
    float* dst = (per_micro_ && micro_ > 0 ? incoming_ : grad_[cur_]).as<float>() + (lo - shard_off_);
    backend_.grads_to_host_async(lo, hi - lo, dst, comm_.stream());
  }
  b.reduced = true;
}

void ZeroOptimizer::finish_reductions(bool accumulate) {
  const double t0 = now_seconds();
  comm_.synchronize();
  backend_.wait_transfers();
  comm_seconds_ += now_seconds() - t0;
  backend_.zero_grads(range_off_, range_n_);
  if (!accumulate) return;
  float* dst = grad_[cur_].as<float>();
  const float* src = incoming_.as<float>();
  const size_t n = shard_n_;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void ZeroOptimizer::update_tile(const Tile& t, const float* g, uint16_t* bf16, const ops::AdamWHyper& h) {
  ops::AdamWHyper hp = h;
  for (const DecaySegment& p : t.pieces) {
    hp.weight_decay = p.decay ? h.weight_decay : 0.0;
    ops::adamw_update(master_.data() + p.offset, m_.data() + p.offset, v_.data() + p.offset, g + p.offset,
                      bf16 ? bf16 + (p.offset - t.offset) : nullptr, p.count, hp);
  }
}

// Tile k is written into lane k%2's staging buffer and uploaded on that lane while tile k+1 updates; before a
// buffer is refilled, the upload from two tiles ago must have left it.
void ZeroOptimizer::update_and_upload(const float* g, const ops::AdamWHyper& h) {
  for (size_t k = 0; k < tiles_.size(); k++) {
    const Tile& t = tiles_[k];
    const int lane = static_cast<int>(k % 2);
    uint16_t* out = nullptr;
    if (bf16_) {
      backend_.wait_upload(lane);
      out = stage_[lane].as<uint16_t>();
    }
    update_tile(t, g, out, h);
    backend_.params_from_host_async(bf16_ ? static_cast<const void*>(out) : master_.data() + t.offset,
                                    shard_off_ + t.offset, t.count, lane);
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void ZeroOptimizer::upload_shard() {
  for (size_t k = 0; k < tiles_.size(); k++) {
    const Tile& t = tiles_[k];
    const void* src =
        bf16_ ? static_cast<const void*>(bf16_shard_.as<uint16_t>() + t.offset) : master_.data() + t.offset;
    backend_.params_from_host_async(src, shard_off_ + t.offset, t.count, static_cast<int>(k % 2));
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void ZeroOptimizer::gather_params() {
  if (cfg_.zero == 0) return;
  const Tensor& p = backend_.weights();
  const double t0 = now_seconds();
  for (const Bucket& b : buckets_) comm_.all_gather(at(p, b.offset), shard_counts(b), p.dtype);
  comm_.synchronize();
  comm_seconds_ += now_seconds() - t0;
}

void ZeroOptimizer::join_worker() {
  if (!worker_.joinable()) return;
  worker_.join();
  if (worker_error_) std::rethrow_exception(std::exchange(worker_error_, nullptr));
  upload_shard();
  gather_params();
}

double ZeroOptimizer::reduce_gradients() {
  for (bool done : module_done_)
    YUAN_CHECK(!done, "ZeroOptimizer: gradients reduced inside a micro-batch (after_micro_batch not called after "
               "its backward)");
  // The host gradient holds only what this step's micro-batches wrote (see reduce_bucket).
  YUAN_CHECK(micro_ > 0, "ZeroOptimizer: no micro-batch since the last step");
  if (!per_micro_) {
    for (Bucket& b : buckets_)
      if (!b.reduced) reduce_bucket(b);
    finish_reductions(false);
    for (Bucket& b : buckets_) b.reduced = false;
  }  // zero 2: reduced and accumulated micro-batch by micro-batch
  micro_ = 0;
  reduce_in_backward_ = per_micro_;
  const double t0 = now_seconds();
  // At zero 0 every member holds the whole gradient: one of them speaks for the group. With tensor parallelism
  // every tensor rank holds the replicated tensors whole (LayerNorms, the row-parallel layers' biases, wpe):
  // tensor rank 0 counts them, the others only their own parts.
  const TensorParallel& tp = backend_.layout().tp();
  double share = 0;
  if (cfg_.zero == 0 && comm_.rank() != 0) {
    share = 0;
  } else if (tp.size == 1 || tp.rank == 0) {
    share = ops::sum_squares(grad_[cur_].as<float>(), shard_n_);
  } else {
    for (const TensorSpec& t : backend_.layout().tensors()) {
      if (t.split == TpSplit::Replicated) continue;
      const size_t lo = std::max(t.offset, shard_off_), hi = std::min(t.offset + t.numel, shard_off_ + shard_n_);
      if (lo < hi) share += ops::sum_squares(grad_[cur_].as<float>() + (lo - shard_off_), hi - lo);
    }
  }
  optim_seconds_ += now_seconds() - t0;
  return share;
}

ZeroStepStats ZeroOptimizer::step(double lr, double grad_norm, bool skip) {
  YUAN_CHECK(micro_ == 0, "ZeroOptimizer::step before reduce_gradients");
  ZeroStepStats st;
  st.grad_norm = grad_norm;
  double t2 = now_seconds();
  if (worker_.joinable()) {  // the previous step's delayed update lands now, before the next forward
    const double c0 = comm_seconds_;
    join_worker();
    st.background_seconds = worker_seconds_;
    optim_seconds_ += now_seconds() - t2 - (comm_seconds_ - c0);
    t2 = now_seconds();
  }
  auto finish = [&] {
    st.optim_seconds = std::exchange(optim_seconds_, 0.0);
    st.comm_seconds = std::exchange(comm_seconds_, 0.0);
    return st;
  };
  if (skip || !std::isfinite(grad_norm)) {
    st.skipped = true;
    return finish();
  }
  const ops::AdamWHyper h = adamw_hyper(cfg_, lr, ++t_, grad_norm);

  if (cfg_.delayed_update) {
    // The worker owns master, moments, grad_[cur_] and bf16_shard_ until join_worker(); backward meanwhile
    // fills the other gradient buffer. It calls no MPI (FUNNELED) and no communicator.
    const float* g = grad_[cur_].as<float>();
    uint16_t* out = bf16_ ? bf16_shard_.as<uint16_t>() : nullptr;
    // A core left to this thread, which keeps running OpenMP and launching kernels meanwhile. Read here: a new
    // thread's team size starts from the process default, not from configure_threads (util/threads.cpp).
    const int threads = std::max(1, omp_get_max_threads() - 1);
    worker_ = std::thread([this, g, out, h, threads] {
      omp_set_num_threads(threads);
      try {
        const double w0 = now_seconds();
        for (const Tile& t : tiles_) update_tile(t, g, out ? out + t.offset : nullptr, h);
        worker_seconds_ = now_seconds() - w0;
      } catch (...) {
        worker_error_ = std::current_exception();
      }
    });
    cur_ ^= 1;
  } else {
    const double c0 = comm_seconds_;
    update_and_upload(grad_[cur_].as<float>(), h);
    gather_params();
    optim_seconds_ += now_seconds() - t2 - (comm_seconds_ - c0);
  }
  return finish();
}

void ZeroOptimizer::drain() { join_worker(); }

void ZeroOptimizer::check_no_update_in_flight(const char* what) const {
  YUAN_CHECK(!worker_.joinable(), "ZeroOptimizer::%s while a delayed update is in flight (drain() first)", what);
}

void ZeroOptimizer::load_backend_params() {
  check_no_update_in_flight("load_backend_params");
  backend_.set_params(master_.data(), shard_off_, shard_n_);
  gather_params();
}

int ZeroOptimizer::stage() const { return cfg_.zero; }
int ZeroOptimizer::group_rank() const { return comm_.rank(); }
size_t ZeroOptimizer::shard_offset() const { return shard_off_; }
size_t ZeroOptimizer::shard_model_offset() const { return global_off_ + (shard_off_ - range_off_); }
size_t ZeroOptimizer::shard_size() const { return shard_n_; }
float* ZeroOptimizer::master() {
  check_no_update_in_flight("master");
  return master_.data();
}
float* ZeroOptimizer::exp_avg() {
  check_no_update_in_flight("exp_avg");
  return m_.data();
}
float* ZeroOptimizer::exp_avg_sq() {
  check_no_update_in_flight("exp_avg_sq");
  return v_.data();
}
int64_t ZeroOptimizer::adam_step() const { return t_; }
void ZeroOptimizer::set_adam_step(int64_t s) { t_ = s; }

ZeroOptimizers::ZeroOptimizers() {
  ready_ = [this](int module) {
    YUAN_CHECK(module >= 0 && static_cast<size_t>(module) < of_module_.size() && of_module_[module],
               "ready hook: module %d belongs to none of this rank's optimizers", module);
    of_module_[module]->ready_hook()(module);
  };
}

void ZeroOptimizers::add(std::unique_ptr<ZeroOptimizer> opt) {
  const ModuleRange& m = opt->modules();
  YUAN_CHECK(opts_.empty() || opts_.back()->modules().end <= m.first, "ZeroOptimizers: modules [%d, %d) added out "
             "of order", m.first, m.end);
  if (of_module_.size() < static_cast<size_t>(m.end)) of_module_.resize(static_cast<size_t>(m.end), nullptr);
  for (int i = m.first; i < m.end; i++) of_module_[i] = opt.get();
  opts_.push_back(std::move(opt));
}

void ZeroOptimizers::before_last_micro_batch() {
  for (auto& o : opts_) o->before_last_micro_batch();
}

void ZeroOptimizers::after_micro_batch() {
  for (auto& o : opts_) o->after_micro_batch();
}

double ZeroOptimizers::reduce_gradients() {
  double share = 0;
  for (auto& o : opts_) share += o->reduce_gradients();
  return share;
}

ZeroStepStats ZeroOptimizers::step(double lr, double grad_norm, bool skip) {
  ZeroStepStats total;
  total.grad_norm = grad_norm;
  for (auto& o : opts_) {
    const ZeroStepStats st = o->step(lr, grad_norm, skip);
    total.comm_seconds += st.comm_seconds;
    total.optim_seconds += st.optim_seconds;
    total.background_seconds += st.background_seconds;
    total.skipped = st.skipped;
  }
  return total;
}

void ZeroOptimizers::drain() {
  for (auto& o : opts_) o->drain();
}

int ZeroOptimizers::stage() const { return opts_.empty() ? 0 : opts_.front()->stage(); }

}  // namespace yuan
