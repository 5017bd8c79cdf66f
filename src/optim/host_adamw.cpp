#include "optim/host_adamw.h"

#include "util/error.h"
#include "util/log.h"

namespace yuan {

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

HostAdamW::Buffers::Buffers(HostBuffers& k, const ZeroSizes& s)
    : master(k.array(s.shard, Mem::Optimizer)), m(k.array(s.shard, Mem::Optimizer)),
      v(k.array(s.shard, Mem::Optimizer)) {
  if (s.bf16 && s.delayed) bf16_shard = k.transfer(s.shard * sizeof(uint16_t), Mem::Comm);
  if (s.bf16 && !s.delayed)
    for (Allocation& a : stage) a = k.transfer(s.tile * sizeof(uint16_t), Mem::Comm);
}

HostAdamW::HostAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, Communicator& comm,
                     HostBuffers& k, const ParamInit& init, double& comm_seconds)
    : spec_(spec), backend_(backend), comm_(comm), comm_seconds_(comm_seconds), buf_(k, spec.sizes()) {
  // Tiles: the buckets' parts of the shard's pieces, which tile it, each cut where weight decay changes.
  for (const ZeroBucket& b : spec.buckets)
    for (const ZeroSpec::Piece& p : spec.pieces) {
      const size_t tlo = std::max(b.offset, p.layout), thi = std::min(b.offset + b.count, p.layout + p.count);
      if (tlo >= thi) continue;
      Tile t;
      t.offset = p.host + (tlo - p.layout);
      t.count = thi - tlo;
      t.backend = spec.cfg.zero == 3 ? t.offset : tlo;
      t.pieces = decay_segments(layout, tlo, thi);
      for (DecaySegment& d : t.pieces) d.offset = p.host + (d.offset - p.layout);
      YUAN_CHECK(t.count <= spec.tile, "HostAdamW: a tile of %zu elements exceeds the staging lanes' %zu", t.count,
                 spec.tile);
      tiles_.push_back(std::move(t));
    }
  for (const ZeroSpec::Piece& p : spec.pieces)
    if (p.count) init(p.layout, p.count, buf_.master.data() + p.host);
}

void HostAdamW::update_tile(const Tile& t, const float* g, uint16_t* bf16, const ops::AdamWHyper& h) {
  ops::AdamWHyper hp = h;
  for (const DecaySegment& p : t.pieces) {
    hp.weight_decay = p.decay ? h.weight_decay : 0.0;
    ops::adamw_update(buf_.master.data() + p.offset, buf_.m.data() + p.offset, buf_.v.data() + p.offset,
                      g + p.offset, bf16 ? bf16 + (p.offset - t.offset) : nullptr, p.count, hp);
  }
}

// Tile k is written into lane k%2's staging buffer and uploaded on that lane while tile k+1 updates; before a
// buffer is refilled, the upload from two tiles ago must have left it.
void HostAdamW::update_and_upload(const float* g, const ops::AdamWHyper& h) {
  for (size_t k = 0; k < tiles_.size(); k++) {
    const Tile& t = tiles_[k];
    const int lane = static_cast<int>(k % 2);
    uint16_t* out = nullptr;
    if (spec_.bf16) {
      backend_.wait_upload(lane);
      out = buf_.stage[lane].as<uint16_t>();
    }
    update_tile(t, g, out, h);
    backend_.params_from_host_async(spec_.bf16 ? static_cast<const void*>(out) : buf_.master.data() + t.offset,
                                    t.backend, t.count, lane);
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void HostAdamW::update(const float* g, const ops::AdamWHyper& h) {
  uint16_t* out = spec_.bf16 ? buf_.bf16_shard.as<uint16_t>() : nullptr;
  for (const Tile& t : tiles_) update_tile(t, g, out ? out + t.offset : nullptr, h);
}

void HostAdamW::upload_shard() {
  for (size_t k = 0; k < tiles_.size(); k++) {
    const Tile& t = tiles_[k];
    const void* src = spec_.bf16 ? static_cast<const void*>(buf_.bf16_shard.as<uint16_t>() + t.offset)
                                 : buf_.master.data() + t.offset;
    backend_.params_from_host_async(src, t.backend, t.count, static_cast<int>(k % 2));
  }
  for (int lane : {0, 1}) backend_.wait_upload(lane);
}

void all_gather_weights(const ZeroSpec& spec, Backend& backend, Communicator& comm, double& comm_seconds) {
  if (spec.cfg.zero == 0 || spec.cfg.zero == 3) return;
  const Tensor& p = backend.weights();
  const double t0 = now_seconds();
  for (const ZeroBucket& b : spec.buckets)
    comm.all_gather(p.elements(b.offset, b.count).data, spec.shard_counts(b), p.dtype);
  comm.synchronize();
  comm_seconds += now_seconds() - t0;
}

void HostAdamW::gather() { all_gather_weights(spec_, backend_, comm_, comm_seconds_); }

void HostAdamW::load_backend() { backend_.set_params(buf_.master.data(), spec_.shard_off, spec_.shard_n); }

}  // namespace yuan
