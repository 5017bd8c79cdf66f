#include "optim/zero3_params.h"

#include <algorithm>
#include <utility>

#include "util/error.h"
#include "util/log.h"

namespace yuan {

static bool is_block(const GPTConfig& c, int module) { return module >= block_module(0) && module < ln_f_module(c); }

std::vector<size_t> zero3_buffers(const ParamLayout& layout, ModuleRange modules) {
  std::vector<size_t> out;
  size_t block = 0;
  for (int m = modules.first; m < modules.end; m++) {
    if (is_block(layout.config(), m))
      block = std::max(block, layout.module(m).numel);
    else
      out.push_back(layout.module(m).numel);
  }
  if (block) out.insert(out.end(), {block, block});
  return out;
}

size_t zero3_buffer_elements(const ParamLayout& layout, ModuleRange modules) {
  if (!modules.size()) modules = {layout.modules().front().index, layout.modules().back().index + 1};
  size_t n = 0;
  for (size_t b : zero3_buffers(layout, modules)) n += b;
  return n;
}

ParamMemory zero_param_memory(const ParamLayout& layout, std::optional<size_t> shards) {
  if (!shards) return layout.total();
  const size_t buffers = zero3_buffer_elements(layout, {});
  return {*shards + buffers, buffers};
}

Zero3Params::Zero3Params(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, Communicator& comm,
                         HostGradient& host, DeviceAdamW* device, double& comm_seconds,
                         std::unique_ptr<Communicator> gathers)
    : spec_(spec), layout_(layout), backend_(backend), comm_(comm), host_(host), device_(device),
      comm_seconds_(comm_seconds) {
  const size_t w = dtype_size(backend.weights().dtype);
  for (size_t n : zero3_buffers(layout, spec.modules)) {
    gathered_.push_back({backend.alloc(n * w, Mem::Params)});
    grad_bufs_.push_back({backend.alloc(n * sizeof(float), Mem::Grads)});
  }
  if (gathers) {
    YUAN_CHECK(!comm.stream() && !gathers->stream() && gathers->size() == comm.size() &&
                   gathers->rank() == comm.rank(),
               "ZeroOptimizer: the gathers' communicator must be a host communicator over the group's ranks");
    gather_thread_ = std::make_unique<comm::CommThread>(std::move(gathers));
  }
}

void Zero3Params::after_micro_batch() {
  flush_reductions();
  if (device_) {
    backend_.compute_after(comm_.stream());
    accumulate_reduced();
  }
  for (const ModuleBuffer& w : gathered_)
    YUAN_CHECK(w.pins == 0, "ZeroOptimizer: module %d acquired and not released in a micro-batch", w.module);
}

void Zero3Params::weights_changed() {
  for (ModuleBuffer& b : gathered_) {
    YUAN_CHECK(b.pins == 0, "ZeroOptimizer: weights changed while module %d is acquired", b.module);
    wait_gather(b);
    b.module = -1;
  }
}

int Zero3Params::held(const std::vector<ModuleBuffer>& pool, int module) {
  for (size_t i = 0; i < pool.size(); i++)
    if (pool[i].module == module) return static_cast<int>(i);
  return -1;
}

// A module outside the blocks has the buffer of its own size; a block takes the blocks' buffer that is free (for
// weights: not acquired, and the one used longer ago). -1 when none is.
int Zero3Params::buffer_for(std::vector<ModuleBuffer>& pool, int module, bool weights) const {
  const GPTConfig& c = layout_.config();
  int own = 0;  // the buffers of the other modules come first, in module order
  for (int m = spec_.modules.first; m < module; m++) own += !is_block(c, m);
  if (!is_block(c, module)) return own;
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
void Zero3Params::gather(int module) {
  if (held(gathered_, module) >= 0) return;
  const int i = buffer_for(gathered_, module, true);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: no buffer free to gather module %s (both blocks' buffers are acquired)",
             layout_.module(module).name.c_str());
  ModuleBuffer& b = gathered_[i];
  YUAN_CHECK(b.pins == 0, "ZeroOptimizer: module %d's buffer is acquired", b.module);
  wait_gather(b);  // a prefetch that was never used may still be writing it
  const Tensor& shard = backend_.weights();
  const ZeroSpec::Piece& p = spec_.pieces[spec_.piece_of_module[module]];
  const size_t w = dtype_size(shard.dtype), lo = p.layout - layout_.module(module).offset;
  const double t0 = now_seconds();
  if (p.count)
    backend_.ops().copy(Tensor(b.mem.as<char>() + lo * w, shard.dtype, 1, static_cast<int64_t>(p.count)),
                        Tensor(static_cast<char*>(shard.data) + p.host * w, shard.dtype, 1,
                               static_cast<int64_t>(p.count)));
  const std::vector<size_t> counts = spec_.module_counts(layout_.module(module).numel);
  if (gather_thread_)
    b.ticket = gather_thread_->all_gather(b.mem.as<void>(), counts, shard.dtype);
  else
    comm_.all_gather(b.mem.as<void>(), counts, shard.dtype);
  comm_seconds_ += now_seconds() - t0;
  b.module = module;
}

void Zero3Params::wait_gather(ModuleBuffer& b) {
  if (!b.ticket) return;
  const double t0 = now_seconds();
  gather_thread_->wait(std::exchange(b.ticket, 0));
  comm_seconds_ += now_seconds() - t0;
}

void Zero3Params::reduce_module(int module) {
  const int i = held(grad_bufs_, module);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: module %d reported ready without its gradient taken", module);
  ModuleBuffer* g = &grad_bufs_[i];
  const ZeroSpec::Piece& p = spec_.pieces[spec_.piece_of_module[module]];
  const double t0 = now_seconds();
  comm_.reduce_scatter(g->mem.as<void>(), spec_.module_counts(layout_.module(module).numel), DType::F32);
  comm_seconds_ += now_seconds() - t0;
  if (device_) {
    reduced_.push_back(module);  // the buffer stays taken until its piece is accumulated
    return;
  }
  if (p.count) {
    const size_t lo = p.layout - layout_.module(module).offset;
    backend_.to_host_async(host_.target() + p.host,
                           Tensor(g->mem.as<float>() + lo, DType::F32, 1, static_cast<int64_t>(p.count)),
                           comm_.stream());
  }
  g->module = -1;  // reused by a later acquire, whose compute waits for this copy (compute_after_transfers)
}

// On the compute stream, before any later zeroing of the buffer (a later acquire's, enqueued after this).
void Zero3Params::accumulate_reduced() {
  for (int module : reduced_) {
    ModuleBuffer& g = grad_bufs_[held(grad_bufs_, module)];
    const ZeroSpec::Piece& p = spec_.pieces[spec_.piece_of_module[module]];
    if (p.count) {
      const size_t lo = p.layout - layout_.module(module).offset;
      device_->accumulate(Tensor(g.mem.as<float>() + lo, DType::F32, 1, static_cast<int64_t>(p.count)), p.host,
                          host_.micro_batches() == 0);
    }
    g.module = -1;
  }
  reduced_.clear();
}

void Zero3Params::flush_reductions() {
  for (int m : pending_) reduce_module(m);
  pending_.clear();
}

// The order on a device: compute waits for the gradient copies issued so far (a gradient buffer may be taken
// again below) and for the gather of this module, and with it for the reductions issued at the last acquire, whose
// pieces (state on the device) are then accumulated, freeing their buffers; then the reductions reported since the
// last acquire and the gather of the module that comes next go out behind the compute already enqueued, and run
// beside this one's.
// The emulator's lazy streams (cuda/emu) turn any missing wait here into wrong weights in its training test.
void Zero3Params::acquire(int module, bool grads) {
  const ModuleRange& mods = spec_.modules;
  YUAN_CHECK(mods.contains(module), "ZeroOptimizer: module %d acquired, outside modules [%d, %d)", module,
             mods.first, mods.end);
  if (grads) backend_.compute_after_transfers();
  gather(module);
  backend_.compute_after(comm_.stream());
  accumulate_reduced();
  ModuleBuffer& b = gathered_[held(gathered_, module)];
  wait_gather(b);
  b.pins++;
  b.last_use = ++uses_;
  // The gradient buffer is taken before the pending reductions go out: theirs are still busy, and the free ones'
  // copies or accumulations are behind the compute_after_transfers or the accumulate_reduced above.
  if (grads && held(grad_bufs_, module) < 0) {
    const int i = buffer_for(grad_bufs_, module, false);
    YUAN_CHECK(i >= 0 && grad_bufs_[i].module < 0, "ZeroOptimizer: no gradient buffer free for module %s",
               layout_.module(module).name.c_str());
    ModuleBuffer& g = grad_bufs_[i];
    g.module = module;
    backend_.ops().zero(Tensor(g.mem.as<float>(), DType::F32, 1, static_cast<int64_t>(layout_.module(module).numel)));
  }
  flush_reductions();
  const int next = module + (grads ? -1 : 1);  // backward walks the modules down, forward up
  if (mods.contains(next) && held(gathered_, next) < 0 && buffer_for(gathered_, next, true) >= 0) gather(next);
}

void Zero3Params::release(int module) {
  const int i = held(gathered_, module);
  YUAN_CHECK(i >= 0 && gathered_[i].pins > 0, "ZeroOptimizer: module %d released without being acquired", module);
  gathered_[i].pins--;
}

Tensor Zero3Params::weight(const TensorSpec& t) const {
  const int i = held(gathered_, t.module);
  YUAN_CHECK(i >= 0 && gathered_[i].pins > 0, "ZeroOptimizer: weight %s read while its module is not acquired",
             t.name.c_str());
  return tensor_view(gathered_[i].mem.as<void>(), backend_.weights().dtype, t, layout_.module(t.module).offset);
}

Tensor Zero3Params::grad(const TensorSpec& t) const {
  const int i = held(grad_bufs_, t.module);
  YUAN_CHECK(i >= 0, "ZeroOptimizer: gradient of %s used while its module is not acquired for backward",
             t.name.c_str());
  return tensor_view(grad_bufs_[i].mem.as<void>(), DType::F32, t, layout_.module(t.module).offset);
}

}  // namespace yuan
