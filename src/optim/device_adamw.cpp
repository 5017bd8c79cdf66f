#include "optim/device_adamw.h"

#include <algorithm>

#include "util/error.h"

namespace yuan {

static size_t state_tensors(const ZeroSizes& s) { return 3 + (s.sharded ? 1 : 0) + (s.delayed ? 1 : 0); }

size_t DeviceAdamW::device_bytes(const ZeroSizes& s) { return state_tensors(s) * s.shard * sizeof(float); }

DeviceAdamW::Buffers::Buffers(HostBuffers& k, Backend* backend, const ZeroSizes& s)
    : master(k.array(s.shard, Mem::Comm)), m(k.array(s.shard, Mem::Comm)), v(k.array(s.shard, Mem::Comm)) {
  if (backend && s.shard) state = backend->alloc(device_bytes(s), Mem::Optimizer);  // zeroed: the moments start at 0
}

DeviceAdamW::DeviceAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, HostBuffers& k,
                         const ParamInit& init)
    : spec_(spec), backend_(backend), buf_(k, &backend, spec.sizes()) {
  for (const ZeroSpec::Piece& p : spec.pieces)
    for (DecaySegment d : decay_segments(layout, p.layout, p.layout + p.count)) {
      d.offset = p.host + (d.offset - p.layout);
      segments_.push_back(d);
    }
  // The initial master weights go through the host copy that checkpoints use.
  for (const ZeroSpec::Piece& p : spec.pieces)
    if (p.count) init(p.layout, p.count, buf_.master.data() + p.host);
  if (spec.shard_n) backend_.ops().from_host_f32(part(0, 0, spec.shard_n), buf_.master.data());
}

Tensor DeviceAdamW::part(int k, size_t offset, size_t count) const {
  return Tensor(buf_.state.as<float>() + static_cast<size_t>(k) * spec_.shard_n + offset, DType::F32, 1,
                static_cast<int64_t>(count));
}

Tensor DeviceAdamW::grad() const {
  return spec_.cfg.zero.shards_weights() ? part(3, 0, spec_.shard_n)
                                         : backend_.grads().elements(spec_.shard_off, spec_.shard_n);
}

void DeviceAdamW::accumulate(const Tensor& reduced, size_t offset, bool first) {
  const Tensor dst = grad().elements(offset, reduced.numel());
  first ? backend_.ops().copy(dst, reduced) : backend_.ops().add(dst, reduced);
}

void DeviceAdamW::update_from(const Tensor& g, const ops::AdamWHyper& h) {
  const Tensor weights = backend_.weights().elements(spec_.shard_off, spec_.shard_n);
  ops::AdamWHyper hs = h;
  for (const DecaySegment& d : segments_) {
    hs.weight_decay = d.decay ? h.weight_decay : 0.0;
    backend_.ops().adamw(part(0, d.offset, d.count), part(1, d.offset, d.count), part(2, d.offset, d.count),
                         g.elements(d.offset, d.count), weights.elements(d.offset, d.count), hs);
  }
  host_copies_out_ = false;  // copies handed out before the update are stale: never loaded back
}

void DeviceAdamW::save_gradient() {
  if (spec_.shard_n) backend_.ops().copy(saved(), grad());
}

void DeviceAdamW::load_backend() {
  if (spec_.shard_n == 0) return;
  if (host_copies_out_) {
    backend_.ops().from_host_f32(part(0, 0, spec_.shard_n), buf_.master.data());
    backend_.ops().from_host_f32(part(1, 0, spec_.shard_n), buf_.m.data());
    backend_.ops().from_host_f32(part(2, 0, spec_.shard_n), buf_.v.data());
    host_copies_out_ = false;
  }
  backend_.ops().copy(backend_.weights().elements(spec_.shard_off, spec_.shard_n), part(0, 0, spec_.shard_n));
}

float* DeviceAdamW::download(int k, HostArray<float>& host) {
  if (spec_.shard_n) backend_.ops().to_host_f32(host.data(), part(k, 0, spec_.shard_n));
  host_copies_out_ = true;
  return host.data();
}

}  // namespace yuan
