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

HostAdamW::HostAdamW(const ZeroSpec& spec, const ParamLayout& layout, Backend& backend, HostBuffers& k,
                     const ParamInit& init)
    : spec_(spec), backend_(backend), buf_(k, spec.sizes()) {
  // Tiles: the buckets' parts of the shard's pieces, which tile it, each cut where weight decay changes.
  for (size_t bi = 0; bi < spec.buckets.size(); bi++)
    for (const ZeroSpec::Piece& p : spec.pieces) {
      const ZeroBucket& b = spec.buckets[bi];
      const size_t tlo = std::max(b.offset, p.layout), thi = std::min(b.offset + b.count, p.layout + p.count);
      if (tlo >= thi) continue;
      Tile t;
      t.bucket = bi;
      t.offset = p.host + (tlo - p.layout);
      t.count = thi - tlo;
      t.backend = spec.cfg.zero.shards_weights() ? t.offset : tlo;
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

// The buckets go in reverse (spec.buckets is in the order backward finishes them), so the weights the next forward
// needs first are the first up; every rank calls `uploaded` for every bucket in the same order, tiles or not, since
// at zero 1 and 2 it is a collective.
void HostAdamW::in_forward_order(const std::function<void(const Tile&, size_t)>& upload,
                                 const BucketUploaded& uploaded) {
  size_t k = 0, next = tiles_.size();  // tiles_ is bucket-major: a bucket's tiles are the run below `next`
  for (size_t bi = spec_.buckets.size(); bi-- > 0;) {
    size_t first = next;
    while (first > 0 && tiles_[first - 1].bucket == bi) first--;
    for (size_t i = first; i < next; i++) upload(tiles_[i], k++);
    next = first;
    uploaded(spec_.buckets[bi]);
  }
}

// Tile k is written into lane k%2's staging buffer and uploaded on that lane while tile k+1 updates; before a
// lane is refilled, the upload from two tiles ago must have left it (with fp32 weights the lanes read master,
// which only the next step's update rewrites, after the gradients that came after the uploads' compute).
HostAdamW::UpdateTimes HostAdamW::update_and_upload(const float* g, const ops::AdamWHyper& h,
                                                    const BucketUploaded& uploaded) {
  UpdateTimes times;
  in_forward_order(
      [&](const Tile& t, size_t k) {
        const int lane = static_cast<int>(k % 2);
        const double t0 = now_seconds();
        backend_.wait_upload(lane);
        const double t1 = now_seconds();
        uint16_t* out = spec_.bf16 ? buf_.stage[lane].as<uint16_t>() : nullptr;
        update_tile(t, g, out, h);
        times.lane_wait += t1 - t0;
        times.adamw += now_seconds() - t1;
        backend_.params_from_host_async(out ? static_cast<const void*>(out) : buf_.master.data() + t.offset,
                                        t.backend, t.count, lane);
      },
      uploaded);
  return times;
}

void HostAdamW::update(const float* g, const ops::AdamWHyper& h) {
  // The previous upload_shard's reads of what this rewrites. With the delayed update this runs on its thread while
  // the training thread enqueues and computes: a backend's wait_upload is safe from another thread.
  for (int lane : {0, 1}) backend_.wait_upload(lane);
  uint16_t* out = spec_.bf16 ? buf_.bf16_shard.as<uint16_t>() : nullptr;
  for (const Tile& t : tiles_) update_tile(t, g, out ? out + t.offset : nullptr, h);
}

void HostAdamW::upload_shard(const BucketUploaded& uploaded) {
  in_forward_order(
      [&](const Tile& t, size_t k) {
        const void* src = spec_.bf16 ? static_cast<const void*>(buf_.bf16_shard.as<uint16_t>() + t.offset)
                                     : buf_.master.data() + t.offset;
        backend_.params_from_host_async(src, t.backend, t.count, static_cast<int>(k % 2));
      },
      uploaded);
}

void gather_bucket(const ZeroSpec& spec, Backend& backend, Communicator& comm, const ZeroBucket& b) {
  // Below ZeRO 1 every rank updated every weight; at ZeRO 3 the passes gather each module as they use it.
  if (!spec.cfg.zero.shards_optimizer_state() || spec.cfg.zero.shards_weights()) return;
  // A device communicator's gather runs after the compute enqueued so far, which waits for the uploads; a host
  // communicator's reads the weights now.
  if (!comm.stream())
    for (int lane : {0, 1}) backend.wait_upload(lane);
  const Tensor& p = backend.weights();
  comm.all_gather(p.elements(b.offset, b.count).data, spec.shard_counts(b), p.dtype);
}

void HostAdamW::load_backend() { backend_.set_params(buf_.master.data(), spec_.shard_off, spec_.shard_n); }

}  // namespace yuan
