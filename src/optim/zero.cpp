#include "optim/zero.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/error.h"
#include "util/log.h"

namespace yuan {

ZeroHostMemory zero_host_memory(const ZeroSizes& s) {
  HostBuffers count;
  HostGradient::Buffers(count, s);
  if (s.device)
    DeviceAdamW::Buffers(count, nullptr, s);
  else
    HostAdamW::Buffers(count, s);
  return {count.bytes(Mem::Optimizer), count.bytes(Mem::Comm)};
}

size_t zero_device_memory(const ZeroSizes& s) { return s.device ? DeviceAdamW::device_bytes(s) : 0; }

size_t zero_optimizer_bytes(size_t shard, bool delayed_update) {
  ZeroSizes s;
  s.shard = shard;
  s.delayed = delayed_update;
  return zero_host_memory(s).optimizer;
}

OffloadSplit& OffloadSplit::operator+=(const OffloadSplit& o) {
  down_bytes += o.down_bytes;
  up_bytes += o.up_bytes;
  grads_wait += o.grads_wait;
  adamw += o.adamw;
  weights_wait += o.weights_wait;
  return *this;
}

// The optimizer's spec for this rank of `comm`, once the backend is known to fit the stage.
static ZeroSpec checked_spec(const ParamLayout& layout, const OptimConfig& cfg, Backend& backend,
                             Communicator& comm, ModuleRange modules, bool overlap) {
  YUAN_CHECK(cfg.zero.valid(), "optim.zero = %d: must be 0, 1, 2 or 3", cfg.zero.number());
  YUAN_CHECK(!cfg.zero.shards_weights() || overlap, "optim.zero = 3 gathers and reduces each module as the passes "
             "use it, so every member of its group must run the same passes: it needs one stage per pipeline");
  YUAN_CHECK(!optimizer_on_device(cfg) || backend.device() != Device::Cpu, "optim.offload = none: the %s backend "
             "has no device memory apart from the host's (use host or auto)", backend.name());
  const DType wdt = backend.weights().dtype;
  YUAN_CHECK(wdt == DType::F32 || wdt == DType::BF16, "backend %s: working weights must be f32 or bf16",
             backend.name());
  ZeroSpec spec(layout, modules, cfg, comm.size(), comm.rank(), overlap, wdt);
  if (!cfg.zero.shards_weights()) {
    YUAN_CHECK(!backend.sharded(), "ZeroOptimizer: optim.zero = %d with a backend made for ZeRO-3 shards",
               cfg.zero.number());
    YUAN_CHECK(backend.size() == layout.total(), "ZeroOptimizer: the backend's %zu-element buffers do not hold the "
               "layout's %zu parameters", backend.size(), layout.total());
  } else {
    YUAN_CHECK(backend.sharded() && backend.size() == spec.shard_n, "ZeroOptimizer: optim.zero = 3 needs a backend "
               "holding this rank's %zu shard elements (backend_spec with them), not %s", spec.shard_n,
               backend.sharded() ? strf("%zu", backend.size()).c_str() : "the whole layout");
  }
  return spec;
}

ZeroOptimizer::ZeroOptimizer(const OptimConfig& cfg, Backend& backend, const ParamLayout& layout, Communicator& comm,
                             const ParamInit& init, ModuleRange modules, bool overlap,
                             std::unique_ptr<Communicator> gathers)
    : ZeroOptimizer(layout, cfg, backend, comm, init, modules, overlap, std::move(gathers),
                    HostBuffers(backend)) {}

// The units allocate their host buffers through `buffers`, the walk that zero_host_memory counts.
ZeroOptimizer::ZeroOptimizer(const ParamLayout& layout, const OptimConfig& cfg, Backend& backend, Communicator& comm,
                             const ParamInit& init, ModuleRange modules, bool overlap,
                             std::unique_ptr<Communicator> gathers, HostBuffers&& buffers)
    : layout_(layout), spec_(checked_spec(layout, cfg, backend, comm, modules, overlap)), backend_(backend),
      comm_(comm), grad_(buffers, spec_.sizes()), buckets_(spec_, layout_, backend, comm, grad_, comm_seconds_) {
  if (spec_.device)
    device_ = std::make_unique<DeviceAdamW>(spec_, layout_, backend, buffers, init);
  else
    host_ = std::make_unique<HostAdamW>(spec_, layout_, backend, buffers, init);
  // The model as this tensor rank holds it: every module, each tensor its part of (the whole model without tensor
  // parallelism). Checkpoints place shards there.
  const GPTConfig& c = layout.config();
  global_off_ = ParamLayout(c, held_modules(c, all_modules(c)), layout.tp()).module(spec_.modules.first).offset;
  if (cfg.zero.shards_weights())
    zero3_ = std::make_unique<Zero3Params>(spec_, layout_, backend, comm, grad_, device_.get(), comm_seconds_,
                                           std::move(gathers));
  ready_ = [this](int module) { module_ready(module); };
  load_backend_params();
}

ZeroOptimizer::~ZeroOptimizer() = default;  // delayed_ waits for an update in flight before the buffers go

Zero3Params& ZeroOptimizer::zero3(const char* what) const {
  YUAN_CHECK(zero3_, "ZeroOptimizer::%s: the optimizer is a ParamSource at optim.zero = 3 only (it is %d)", what,
             spec_.cfg.zero.number());
  return *zero3_;
}

void ZeroOptimizer::module_ready(int module) {
  buckets_.module_ready(module);
  if (zero3_) zero3_->module_ready(module);  // reduced at the next acquire, once the compute that follows is enqueued
}

void ZeroOptimizer::after_micro_batch() {
  if (zero3_) zero3_->after_micro_batch();
  buckets_.after_micro_batch();
}

double ZeroOptimizer::reduce_gradients() {
  if (host_)  // zero 2 and 3 bring every micro-batch's reduced part down, zero 0 and 1 the step's once
    split_.down_bytes += spec_.shard_n * sizeof(float) *
                         static_cast<uint64_t>(spec_.per_micro ? std::max(grad_.micro_batches(), 1) : 1);
  buckets_.reduce();
  if (host_) split_.grads_wait += buckets_.take_transfer_wait();
  const double t0 = now_seconds();
  const double share = buckets_.norm_share(device_ ? device_->grad() : Tensor());
  optim_seconds_ += now_seconds() - t0;
  return share;
}

void ZeroOptimizer::publish() {
  if (!zero3_)
    for (const ZeroBucket& b : spec_.buckets) gather_bucket(spec_, backend_, comm_, b);
  published();
}

void ZeroOptimizer::published() {
  if (zero3_) {
    zero3_->weights_changed();
    return;
  }
  // The next forward reads the gathered weights on the device: its compute waits for the gathers there, and the
  // host goes on (a host communicator's gathers are complete already). A peer that never joins a gather then
  // holds the compute stream, and the host's next wait on it ends at dist.nccl_timeout_s (bound_device_waits).
  if (spec_.cfg.zero.shards_optimizer_state()) backend_.compute_after(comm_.stream());
}

void ZeroOptimizer::land_uploads(double since) {
  published();
  split_.weights_wait += now_seconds() - since;
  split_.up_bytes += spec_.shard_n * dtype_size(backend_.weights().dtype);
}

HostAdamW::BucketUploaded ZeroOptimizer::gather_uploaded() {
  return [this](const ZeroBucket& b) { gather_bucket(spec_, backend_, comm_, b); };
}

double ZeroOptimizer::land_delayed() {
  double seconds = 0;  // beside compute: none on the device, where the update runs here, on the critical path
  if (device_) {
    device_->update_saved(*saved_);
    saved_.reset();
    publish();
  } else {
    seconds = delayed_.wait();
    const double t0 = now_seconds();
    host_->upload_shard(gather_uploaded());
    land_uploads(t0);
  }
  return seconds;
}

bool ZeroOptimizer::update_in_flight() const { return delayed_.in_flight() || saved_.has_value(); }

ZeroStepStats ZeroOptimizer::step(double lr, double grad_norm, bool skip) {
  YUAN_CHECK(grad_.micro_batches() == 0, "ZeroOptimizer::step before reduce_gradients");
  ZeroStepStats st;
  st.grad_norm = grad_norm;
  double t2 = now_seconds();
  if (update_in_flight()) {  // the previous step's delayed update lands now, before the next forward
    const double c0 = comm_seconds_;
    st.background_seconds = land_delayed();
    optim_seconds_ += now_seconds() - t2 - (comm_seconds_ - c0);
    t2 = now_seconds();
  }
  auto finish = [&] {
    st.optim_seconds = std::exchange(optim_seconds_, 0.0);
    st.comm_seconds = std::exchange(comm_seconds_, 0.0);
    if (host_) st.offload = std::exchange(split_, {});
    return st;
  };
  if (skip || !std::isfinite(grad_norm)) {
    drop_backend_grads();  // the host path never copied them
    st.skipped = true;
    return finish();
  }
  const ops::AdamWHyper h = adamw_hyper(spec_.cfg, lr, host_ ? host_->next_step() : device_->next_step(), grad_norm);
  if (device_) {
    // The update reads the reduced gradient on the device; the next step's backward adds into zeros.
    const double c0 = comm_seconds_;
    if (spec_.cfg.delayed_update) {
      device_->save_gradient();
      saved_ = h;
    } else {
      device_->update(h);
    }
    drop_backend_grads();
    if (!saved_) publish();
    optim_seconds_ += now_seconds() - t2 - (comm_seconds_ - c0);
  } else if (spec_.cfg.delayed_update) {
    // The thread owns master, moments, the current gradient and the bf16 shard until land_delayed(); backward
    // meanwhile fills the other gradient buffer.
    const float* g = grad_.current();
    delayed_.start([this, g, h] { host_->update(g, h); });
    grad_.swap();
  } else {
    const double c0 = comm_seconds_;
    const HostAdamW::UpdateTimes u = host_->update_and_upload(grad_.current(), h, gather_uploaded());
    split_.adamw += u.adamw;
    split_.weights_wait += u.lane_wait;
    land_uploads(now_seconds());
    optim_seconds_ += now_seconds() - t2 - (comm_seconds_ - c0);
  }
  return finish();
}

void ZeroOptimizer::drop_backend_grads() {
  if (device_ && !spec_.cfg.zero.shards_weights()) backend_.zero_grads(spec_.range_off, spec_.range_n);
}

void ZeroOptimizer::drain() {
  if (update_in_flight()) land_delayed();
}

void ZeroOptimizer::check_no_update_in_flight(const char* what) const {
  YUAN_CHECK(!update_in_flight(), "ZeroOptimizer::%s while a delayed update is in flight (drain() first)", what);
}

void ZeroOptimizer::load_backend_params() {
  check_no_update_in_flight("load_backend_params");
  host_ ? host_->load_backend() : device_->load_backend();
  publish();
}

std::vector<ShardPiece> ZeroOptimizer::shard_pieces() const {
  std::vector<ShardPiece> out;
  for (const ZeroSpec::Piece& p : spec_.pieces) out.push_back({global_off_ + (p.layout - spec_.range_off), p.count});
  return out;
}

float* ZeroOptimizer::master() {
  check_no_update_in_flight("master");
  return host_ ? host_->master() : device_->master();
}
float* ZeroOptimizer::exp_avg() {
  check_no_update_in_flight("exp_avg");
  return host_ ? host_->exp_avg() : device_->exp_avg();
}
float* ZeroOptimizer::exp_avg_sq() {
  check_no_update_in_flight("exp_avg_sq");
  return host_ ? host_->exp_avg_sq() : device_->exp_avg_sq();
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
    if (st.offload) total.offload = total.offload.value_or(OffloadSplit{}) += *st.offload;
  }
  return total;
}

void ZeroOptimizers::drain() {
  for (auto& o : opts_) o->drain();
}

ZeroStage ZeroOptimizers::stage() const { return opts_.empty() ? ZeroStage(0) : opts_.front()->stage(); }

ParamSource* ZeroOptimizers::param_source() {
  if (!stage().shards_weights()) return nullptr;
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
