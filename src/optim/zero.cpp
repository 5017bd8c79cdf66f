#include "optim/zero.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "util/error.h"
#include "util/log.h"

namespace yuan {

Shard zero_shard(size_t n, int ranks, int rank, int stage) {
  if (stage == 0) return {0, n};
  const size_t stride = (n + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const size_t lo = std::min(n, static_cast<size_t>(rank) * stride), hi = std::min(n, lo + stride);
  return {lo, hi - lo};
}

static ModuleRange whole(const ParamLayout& layout, ModuleRange modules) {
  return modules.size() ? modules : ModuleRange{layout.modules().front().index, layout.modules().back().index + 1};
}

size_t zero_shard_elements(const ParamLayout& layout, ModuleRange modules, int ranks, int rank, int stage) {
  modules = whole(layout, modules);
  size_t n = 0;
  if (stage < 3) {
    for (int m = modules.first; m < modules.end; m++) n += layout.module(m).numel;
    return zero_shard(n, ranks, rank, stage).count;
  }
  for (int m = modules.first; m < modules.end; m++) n += zero_shard(layout.module(m).numel, ranks, rank, 1).count;
  return n;
}

std::vector<ModuleRange> zero_buckets(const ParamLayout& layout, ModuleRange modules, const OptimConfig& o) {
  modules = whole(layout, modules);
  const double limit = o.zero == 3 ? 0 : o.bucket_mb * 1048576.0;
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

size_t zero_optimizer_bytes(size_t shard, bool delayed_update) {
  // master, m, v, gradient(s)
  return (delayed_update ? 5 : 4) * shard * sizeof(float);
}

ZeroHostMemory zero_host_memory(const OptimConfig& o, size_t shard, size_t largest_tile, bool overlap,
                                DType weights) {
  ZeroHostMemory m;
  m.optimizer = zero_optimizer_bytes(shard, o.delayed_update);
  if (o.zero >= 2 && overlap) m.staging += shard * sizeof(float);
  if (weights == DType::BF16)
    m.staging += (o.delayed_update ? shard : 2 * std::min(shard, largest_tile)) * sizeof(uint16_t);
  return m;
}

// One buffer for each module outside the blocks, two for the blocks (the largest block: all are the same size).
static std::vector<size_t> zero3_buffers(const ParamLayout& layout, ModuleRange modules) {
  std::vector<size_t> out;
  size_t block = 0;
  const GPTConfig& c = layout.config();
  for (int m = modules.first; m < modules.end; m++) {
    if (m >= block_module(0) && m < ln_f_module(c))
      block = std::max(block, layout.module(m).numel);
    else
      out.push_back(layout.module(m).numel);
  }
  if (block) out.insert(out.end(), {block, block});
  return out;
}

size_t zero3_buffer_elements(const ParamLayout& layout, ModuleRange modules) {
  size_t n = 0;
  for (size_t b : zero3_buffers(layout, whole(layout, modules))) n += b;
  return n;
}

ParamMemory zero_param_memory(const ParamLayout& layout, std::optional<size_t> shards) {
  if (!shards) return layout.total();
  const size_t buffers = zero3_buffer_elements(layout, {});
  return {*shards + buffers, buffers};
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

static char* at(const Tensor& flat, size_t offset) {
  return static_cast<char*>(flat.data) + offset * dtype_size(flat.dtype);
}

ZeroOptimizer::ZeroOptimizer(const OptimConfig& cfg, Backend& backend, const ParamLayout& layout, Communicator& comm,
                             const ParamInit& init, ModuleRange modules, bool overlap,
                             std::unique_ptr<Communicator> gathers)
    : cfg_(cfg), backend_(backend), layout_(layout), comm_(comm), overlap_(overlap),
      per_micro_(cfg.zero >= 2 && overlap) {
  YUAN_CHECK(cfg.zero >= 0 && cfg.zero <= 3, "optim.zero = %d: must be 0, 1, 2 or 3", cfg.zero);
  YUAN_CHECK(cfg.zero < 3 || overlap, "optim.zero = 3 gathers and reduces each module as the passes use it, so "
             "every member of its group must run the same passes: it needs one stage per pipeline");
  modules = whole(layout, modules);
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
  const int n_all = module_count(layout.config());
  if (cfg.zero < 3) {
    YUAN_CHECK(!backend.sharded(), "ZeroOptimizer: optim.zero = %d with a backend made for ZeRO-3 shards", cfg.zero);
    YUAN_CHECK(backend.size() == layout.total(), "ZeroOptimizer: the backend's %zu-element buffers do not hold the "
               "layout's %zu parameters", backend.size(), layout.total());
    const Shard mine = zero_shard(range_n_, comm.size(), comm.rank(), cfg.zero);
    stride_ = zero_shard(range_n_, comm.size(), 0, cfg.zero).count;
    shard_off_ = range_off_ + mine.offset;
    shard_n_ = mine.count;
    pieces_.push_back({shard_off_, 0, shard_n_});
  } else {
    // Each module cut over the group on its own; the backend's flat weights are the pieces one after the other.
    piece_of_module_.assign(static_cast<size_t>(n_all), -1);
    for (int m = modules.first; m < modules.end; m++) {
      const Shard mine = zero_shard(layout.module(m).numel, comm.size(), comm.rank(), 1);
      piece_of_module_[m] = static_cast<int>(pieces_.size());
      pieces_.push_back({layout.module(m).offset + mine.offset, shard_n_, mine.count});
      shard_n_ += mine.count;
    }
    YUAN_CHECK(backend.sharded() && backend.size() == shard_n_, "ZeroOptimizer: optim.zero = 3 needs a backend "
               "holding this rank's %zu shard elements (backend_spec with them), not %s", shard_n_,
               backend.sharded() ? strf("%zu", backend.size()).c_str() : "the whole layout");
  }

  bucket_of_module_.assign(static_cast<size_t>(n_all), -1);
  module_done_.assign(static_cast<size_t>(n_all), false);
  for (const ModuleRange& r : zero_buckets(layout, modules, cfg)) {
    Bucket b;
    b.first_module = r.first;
    b.last_module = r.end - 1;
    b.offset = layout.module(r.first).offset;
    b.count = layout.module(b.last_module).offset + layout.module(b.last_module).numel - b.offset;
    b.pending = r.size();
    for (int m = r.first; m < r.end; m++) bucket_of_module_[m] = static_cast<int>(buckets_.size());
    buckets_.push_back(b);
  }

  // Tiles: the buckets' parts of the shard's pieces, which tile it, each cut where weight decay changes.
  size_t largest = 0;
  for (const Bucket& b : buckets_)
    for (const Piece& p : pieces_) {
      const size_t tlo = std::max(b.offset, p.layout), thi = std::min(b.offset + b.count, p.layout + p.count);
      if (tlo >= thi) continue;
      Tile t;
      t.offset = p.host + (tlo - p.layout);
      t.count = thi - tlo;
      t.backend = cfg.zero == 3 ? t.offset : tlo;
      t.pieces = decay_segments(layout, tlo, thi);
      for (DecaySegment& d : t.pieces) d.offset = p.host + (d.offset - p.layout);
      largest = std::max(largest, t.count);
      tiles_.push_back(std::move(t));
    }
  if (cfg.zero == 3) {
    const std::vector<size_t> sizes = zero3_buffers(layout, modules);
    const size_t w = dtype_size(wdt);
    for (size_t n : sizes) {
      gathered_.push_back({backend.alloc(n * w, Mem::Params)});
      grad_bufs_.push_back({backend.alloc(n * sizeof(float), Mem::Grads)});
    }
    if (gathers) {
      YUAN_CHECK(!comm.stream() && !gathers->stream() && gathers->size() == comm.size() &&
                     gathers->rank() == comm.rank(),
                 "ZeroOptimizer: the gathers' communicator must be a host communicator over the group's ranks");
      gather_thread_ = std::make_unique<parallel::CommThread>(std::move(gathers));
    }
  }

  // What zero_host_memory states.
  master_ = HostArray<float>(shard_n_, Mem::Optimizer);
  m_ = HostArray<float>(shard_n_, Mem::Optimizer);
  v_ = HostArray<float>(shard_n_, Mem::Optimizer);
  for (int i = 0; i < (cfg.delayed_update ? 2 : 1); i++)
    grad_[i] = backend.alloc_transfer(shard_n_ * sizeof(float), Mem::Optimizer);
  if (per_micro_) incoming_ = backend.alloc_transfer(shard_n_ * sizeof(float), Mem::Comm);
  if (bf16_ && cfg.delayed_update) bf16_shard_ = backend.alloc_transfer(shard_n_ * sizeof(uint16_t), Mem::Comm);
  if (bf16_ && !cfg.delayed_update)
    for (Allocation& s : stage_) s = backend.alloc_transfer(largest * sizeof(uint16_t), Mem::Comm);
  for (const Piece& p : pieces_)
    if (p.count) init(p.layout, p.count, master_.data() + p.host);
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
             layout_.module(module).name.c_str());
  module_done_[module] = true;
  if (cfg_.zero == 3) {  // reduced at the next acquire, once the compute that follows is enqueued
    pending_.push_back(module);
    return;
  }
  Bucket& b = buckets_[bucket_of_module_[module]];
  if (--b.pending == 0 && reduce_in_backward_) reduce_bucket(b);
}

void ZeroOptimizer::before_last_micro_batch() { reduce_in_backward_ = overlap_; }

void ZeroOptimizer::after_micro_batch() {
  for (int m = modules_.first; m < modules_.end; m++)
    YUAN_CHECK(module_done_[m], "backend %s finished a micro-batch without reporting module %s ready",
               backend_.name(), layout_.module(m).name.c_str());
  module_done_.assign(module_done_.size(), false);
  for (Bucket& b : buckets_) b.pending = b.last_module - b.first_module + 1;
  if (cfg_.zero == 3) {
    flush_reductions();
    for (const ModuleBuffer& w : gathered_)
      YUAN_CHECK(w.pins == 0, "ZeroOptimizer: module %d acquired and not released in a micro-batch", w.module);
  }
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
  if (cfg_.zero < 3) backend_.zero_grads(range_off_, range_n_);  // zero 3's buffers are zeroed as they are taken
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
                                    t.backend, t.count, lane);
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void ZeroOptimizer::upload_shard() {
  for (size_t k = 0; k < tiles_.size(); k++) {
    const Tile& t = tiles_[k];
    const void* src =
        bf16_ ? static_cast<const void*>(bf16_shard_.as<uint16_t>() + t.offset) : master_.data() + t.offset;
    backend_.params_from_host_async(src, t.backend, t.count, static_cast<int>(k % 2));
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void ZeroOptimizer::gather_params() {
  if (cfg_.zero == 3) {  // gathered modules now hold old weights: they are gathered again where next used
    for (ModuleBuffer& b : gathered_) {
      YUAN_CHECK(b.pins == 0, "ZeroOptimizer: weights changed while module %d is acquired", b.module);
      wait_gather(b);
      b.module = -1;
    }
    return;
  }
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
  const TensorParallel& tp = layout_.tp();
  double share = 0;
  if (cfg_.zero == 0 && comm_.rank() != 0) {
    share = 0;
  } else if (tp.size == 1 || tp.rank == 0) {
    share = ops::sum_squares(grad_[cur_].as<float>(), shard_n_);
  } else {
    for (const TensorSpec& t : layout_.tensors()) {
      if (t.split == TpSplit::Replicated) continue;
      for (const Piece& p : pieces_) {
        const size_t lo = std::max(t.offset, p.layout), hi = std::min(t.offset + t.numel, p.layout + p.count);
        if (lo < hi) share += ops::sum_squares(grad_[cur_].as<float>() + p.host + (lo - p.layout), hi - lo);
      }
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
std::vector<ShardPiece> ZeroOptimizer::shard_pieces() const {
  std::vector<ShardPiece> out;
  for (const Piece& p : pieces_) out.push_back({global_off_ + (p.layout - range_off_), p.count});
  return out;
}
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

// ---- ZeRO-3: the program's ParamSource ----

void ZeroOptimizer::check_zero3(const char* what) const {
  YUAN_CHECK(cfg_.zero == 3, "ZeroOptimizer::%s: the optimizer is a ParamSource at optim.zero = 3 only (it is %d)",
             what, cfg_.zero);
}

std::vector<size_t> ZeroOptimizer::module_counts(int module) const {
  const size_t n = layout_.module(module).numel;
  std::vector<size_t> counts(static_cast<size_t>(comm_.size()));
  for (int r = 0; r < comm_.size(); r++) counts[r] = zero_shard(n, comm_.size(), r, 1).count;
  return counts;
}

int ZeroOptimizer::held(const std::vector<ModuleBuffer>& pool, int module) {
  for (size_t i = 0; i < pool.size(); i++)
    if (pool[i].module == module) return static_cast<int>(i);
  return -1;
}

// A module outside the blocks has the buffer of its own size; a block takes the blocks' buffer that is free (for
// weights: not acquired, and the one used longer ago). -1 when none is.
int ZeroOptimizer::buffer_for(std::vector<ModuleBuffer>& pool, int module, bool weights) const {
  const GPTConfig& c = layout_.config();
  const bool block = module >= block_module(0) && module < ln_f_module(c);
  int own = 0;  // the buffers of the other modules come first, in module order
  for (int m = modules_.first; m < module; m++) own += !(m >= block_module(0) && m < ln_f_module(c));
  if (!block) return own;
  int best = -1;
  const int first = static_cast<int>(pool.size()) - 2;
  for (int i = first; i < first + 2; i++) {
    const ModuleBuffer& b = pool[i];
    const bool free = weights ? b.pins == 0 : b.module < 0;
    if (free && (best < 0 || b.last_use < pool[best].last_use)) best = i;
  }
  return best;
}

// The module's weights: this rank's block copied from the backend's shard into its place, then all-gathered.
void ZeroOptimizer::gather(int module) {
  if (held(gathered_, module) >= 0) return;
  const int i = buffer_for(gathered_, module, true);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: no buffer free to gather module %s (both blocks' buffers are acquired)",
             layout_.module(module).name.c_str());
  ModuleBuffer& b = gathered_[i];
  YUAN_CHECK(b.pins == 0, "ZeroOptimizer: module %d's buffer is acquired", b.module);
  wait_gather(b);  // a prefetch that was never used may still be writing it
  const Tensor& shard = backend_.weights();
  const Piece& p = pieces_[piece_of_module_[module]];
  const size_t w = dtype_size(shard.dtype), lo = p.layout - layout_.module(module).offset;
  const double t0 = now_seconds();
  if (p.count)
    backend_.ops().copy(Tensor(b.mem.as<char>() + lo * w, shard.dtype, 1, static_cast<int64_t>(p.count)),
                        Tensor(at(shard, p.host), shard.dtype, 1, static_cast<int64_t>(p.count)));
  if (gather_thread_)
    b.ticket = gather_thread_->all_gather(b.mem.as<void>(), module_counts(module), shard.dtype);
  else
    comm_.all_gather(b.mem.as<void>(), module_counts(module), shard.dtype);
  comm_seconds_ += now_seconds() - t0;
  b.module = module;
}

void ZeroOptimizer::wait_gather(ModuleBuffer& b) {
  if (!b.ticket) return;
  const double t0 = now_seconds();
  gather_thread_->wait(std::exchange(b.ticket, 0));
  comm_seconds_ += now_seconds() - t0;
}

void ZeroOptimizer::reduce_module(int module) {
  const int i = held(grad_bufs_, module);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: module %d reported ready without its gradient taken", module);
  ModuleBuffer* g = &grad_bufs_[i];
  const Piece& p = pieces_[piece_of_module_[module]];
  const double t0 = now_seconds();
  comm_.reduce_scatter(g->mem.as<void>(), module_counts(module), DType::F32);
  comm_seconds_ += now_seconds() - t0;
  if (p.count) {
    float* dst = (micro_ > 0 ? incoming_ : grad_[cur_]).as<float>() + p.host;
    const size_t lo = p.layout - layout_.module(module).offset;
    backend_.to_host_async(dst, Tensor(g->mem.as<float>() + lo, DType::F32, 1, static_cast<int64_t>(p.count)),
                           comm_.stream());
  }
  g->module = -1;  // reused by a later acquire, whose compute waits for this copy (compute_after_transfers)
}

void ZeroOptimizer::flush_reductions() {
  for (int m : pending_) reduce_module(m);
  pending_.clear();
}

// The order on a device: compute waits for the gradient copies issued so far (a gradient buffer may be taken
// again below) and for the gather of this module; then the reductions reported since the last acquire and the
// gather of the module that comes next go out behind the compute already enqueued, and run beside this one's.
// The emulator's lazy streams (cuda/emu) turn any missing wait here into wrong weights in its training test.
void ZeroOptimizer::acquire(int module, bool grads) {
  check_zero3("acquire");
  YUAN_CHECK(modules_.contains(module), "ZeroOptimizer: module %d acquired, outside modules [%d, %d)", module,
             modules_.first, modules_.end);
  if (grads) backend_.compute_after_transfers();
  gather(module);
  backend_.compute_after(comm_.stream());
  ModuleBuffer& b = gathered_[held(gathered_, module)];
  wait_gather(b);
  b.pins++;
  b.last_use = ++uses_;
  // The gradient buffer is taken before the pending reductions go out: theirs are still busy, and the free ones'
  // copies are behind the compute_after_transfers above.
  if (grads && held(grad_bufs_, module) < 0) {
    const int i = buffer_for(grad_bufs_, module, false);
    YUAN_CHECK(i >= 0 && grad_bufs_[i].module < 0, "ZeroOptimizer: no gradient buffer free for module %s",
               layout_.module(module).name.c_str());
    ModuleBuffer& g = grad_bufs_[i];
    g.module = module;
    backend_.ops().zero(Tensor(g.mem.as<float>(), DType::F32, 1,
                               static_cast<int64_t>(layout_.module(module).numel)));
  }
  flush_reductions();
  const int next = module + (grads ? -1 : 1);  // backward walks the modules down, forward up
  if (modules_.contains(next) && held(gathered_, next) < 0 && buffer_for(gathered_, next, true) >= 0) gather(next);
}

void ZeroOptimizer::release(int module) {
  check_zero3("release");
  const int i = held(gathered_, module);
  YUAN_CHECK(i >= 0 && gathered_[i].pins > 0, "ZeroOptimizer: module %d released without being acquired", module);
  gathered_[i].pins--;
}

Tensor ZeroOptimizer::weight(const TensorSpec& t) const {
  check_zero3("weight");
  const int i = held(gathered_, t.module);
  YUAN_CHECK(i >= 0 && gathered_[i].pins > 0, "ZeroOptimizer: weight %s read while its module is not acquired",
             t.name.c_str());
  return tensor_view(gathered_[i].mem.as<void>(), backend_.weights().dtype, t, layout_.module(t.module).offset);
}

Tensor ZeroOptimizer::grad(const TensorSpec& t) const {
  check_zero3("grad");
  const int i = held(grad_bufs_, t.module);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: gradient of %s used while its module is not acquired for backward",
             t.name.c_str());
  return tensor_view(grad_bufs_[i].mem.as<void>(), DType::F32, t, layout_.module(t.module).offset);
}

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

ParamSource* ZeroOptimizers::param_source() {
  if (stage() < 3) return nullptr;
  YUAN_CHECK(opts_.size() == 1, "optim.zero = 3 with %zu module groups on one rank: it needs one stage per pipeline",
             opts_.size());
  return opts_.front().get();
}

namespace {
template <typename Optimizer>
ZeroStepStats end_step_of(Optimizer& opt, Communicator& world, double lr, double loss) {
  const double share = opt.reduce_gradients();
  const double t0 = now_seconds();
  const double grad_norm = std::sqrt(world.sum(share));
  const double norm_s = now_seconds() - t0;
  ZeroStepStats st = opt.step(lr, grad_norm, !std::isfinite(loss));
  st.comm_seconds += norm_s;
  return st;
}
}  // namespace

ZeroStepStats end_step(ZeroOptimizer& opt, Communicator& world, double lr, double loss) {
  return end_step_of(opt, world, lr, loss);
}

ZeroStepStats end_step(ZeroOptimizers& opts, Communicator& world, double lr, double loss) {
  return end_step_of(opts, world, lr, loss);
}

}  // namespace yuan
