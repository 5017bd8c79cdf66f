// The units of the ZeRO optimizer (optim/zero.h) that need no other rank: its derivation (ZeroSpec), the walk of
// its host buffers that the memory plan sums (HostBuffers, zero_host_memory), the sharded host AdamW on one rank,
// and the delayed-update thread. The units that communicate are checked under mpirun in test_mpi_zero_units.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backend/cpu_backend.h"
#include "comm/communicator.h"
#include "ops/adamw.h"
#include "optim/zero.h"
#include "util/memory.h"

namespace yuan {
namespace {

// 2 layers, C = 5, T = 4, V = 9: 805 parameters, uneven shards over 2, 3 and 4 ranks.
const GPTConfig kTiny{2, 1, 5, 4, 9};

OptimConfig optim(int zero, double bucket_mb) {
  OptimConfig oc;
  oc.zero = ZeroStage(zero);
  oc.bucket_mb = bucket_mb;
  oc.weight_decay = 0.1;
  oc.grad_clip = 1.0;
  return oc;
}

// Every rank's shard and every bucket, for each stage, world size and bucket size: the shards tile the range (each
// rank holds all of it at zero 0), the buckets tile it last module first, and a staging lane holds every tile.
TEST(ZeroSpec, ShardsAndBucketsTileTheRange) {
  const ParamLayout layout(kTiny);
  const size_t n = layout.total();
  for (int stage : {0, 1, 2, 3})
    for (int ranks : {1, 2, 3, 4})
      for (double mb : {0.0, 0.001, 100.0}) {
        SCOPED_TRACE(strf("zero %d, %d ranks, bucket_mb %g", stage, ranks, mb));
        size_t held = 0;
        for (int rank = 0; rank < ranks; rank++) {
          const ZeroSpec s(layout, {}, optim(stage, mb), ranks, rank, true, DType::F32);
          EXPECT_EQ(s.range_n, n);
          EXPECT_EQ(s.shard_n, zero_shard_elements(layout, {}, ranks, rank, ZeroStage(stage)));
          size_t host = 0;
          for (const ZeroSpec::Piece& p : s.pieces) {
            EXPECT_EQ(p.host, host);
            host += p.count;
          }
          EXPECT_EQ(host, s.shard_n);
          held += s.shard_n;
          size_t end = s.range_off + s.range_n;
          for (const ZeroBucket& b : s.buckets) {
            EXPECT_EQ(b.offset + b.count, end);
            end = b.offset;
            if (stage == 3) {
              EXPECT_EQ(b.modules.size(), 1);
            }
            for (const ZeroSpec::Piece& p : s.pieces) {
              const size_t lo = std::max(b.offset, p.layout), hi = std::min(b.offset + b.count, p.layout + p.count);
              if (hi > lo) {
                EXPECT_LE(hi - lo, s.tile);
              }
            }
          }
          EXPECT_EQ(end, s.range_off);
          EXPECT_LE(s.tile, s.shard_n);
          if (stage == 1 || stage == 2) {
            size_t counted = 0;
            for (const ZeroBucket& b : s.buckets) counted += s.shard_counts(b)[rank];
            EXPECT_EQ(counted, s.shard_n) << "the buckets' parts of the shard";
          }
        }
        EXPECT_EQ(held, stage == 0 ? n * ranks : n);
      }
}

TEST(ZeroSpec, ModulesMustBeContiguous) {
  // The last stage's layout holds wte (the tied classifier) apart from its blocks.
  const ParamLayout layout(kTiny, held_modules(kTiny, {block_module(1), module_count(kTiny)}));
  EXPECT_NO_THROW(ZeroSpec(layout, {block_module(1), module_count(kTiny)}, optim(1, 0), 2, 0, true, DType::F32));
  EXPECT_THROW(ZeroSpec(layout, {kWteModule, module_count(kTiny)}, optim(1, 0), 2, 0, true, DType::F32), Error);
}

// What the units' constructors allocate is what the plan's walk counts, category by category, for every
// combination of the flags the buffers depend on.
TEST(ZeroSpec, PlanCountsWhatTheUnitsAllocate) {
  CpuBackend backend(backend_spec(ParamLayout(kTiny)));
  for (int flags = 0; flags < 8; flags++) {
    ZeroSizes s;
    s.shard = 1000;
    s.tile = 300;
    s.delayed = flags & 1;
    s.per_micro = flags & 2;
    s.bf16 = flags & 4;
    SCOPED_TRACE(strf("delayed %d, per micro-batch %d, bf16 %d", s.delayed, s.per_micro, s.bf16));
    const ZeroHostMemory plan = zero_host_memory(s);
    EXPECT_EQ(plan.optimizer, (s.delayed ? 5 : 4) * s.shard * sizeof(float));
    EXPECT_EQ(plan.staging, (s.per_micro ? s.shard * sizeof(float) : 0) +
                                (s.bf16 ? (s.delayed ? s.shard : 2 * s.tile) * sizeof(uint16_t) : 0));
    EXPECT_EQ(zero_optimizer_bytes(s.shard, s.delayed), plan.optimizer);
    const size_t opt0 = mem_bytes(Mem::Optimizer), comm0 = mem_bytes(Mem::Comm);
    {
      HostBuffers k(backend);
      const HostGradient grad(k, s);
      const HostAdamW::Buffers adamw(k, s);
      EXPECT_EQ(mem_bytes(Mem::Optimizer) - opt0, plan.optimizer);
      EXPECT_EQ(mem_bytes(Mem::Comm) - comm0, plan.staging);
      EXPECT_EQ(k.bytes(Mem::Optimizer), plan.optimizer);
      EXPECT_EQ(k.bytes(Mem::Comm), plan.staging);
    }
    EXPECT_EQ(mem_bytes(Mem::Optimizer), opt0);
    EXPECT_EQ(mem_bytes(Mem::Comm), comm0);
  }
}

// With the state on the device (optim.offload = none) the host keeps only the checkpoint's copies of master, m
// and v, no gradient, at every stage; the device holds the state, at zero 3 also the shard's reduced gradient (the
// backend has none there), and with the delayed update the gradient set aside. Zero 3 still reduces every
// micro-batch, zero 2 then once a step.
TEST(ZeroSpec, StateOnTheDeviceCountsItsGradientShardAtZeroThree) {
  OptimConfig oc = optim(2, 0.001);
  oc.offload = Offload::None;
  for (int zero : {0, 1, 2, 3})
    for (bool delayed : {false, true}) {
      SCOPED_TRACE(strf("zero %d, delayed %d", zero, delayed));
      oc.zero = ZeroStage(zero);
      oc.delayed_update = delayed;
      const ZeroSpec spec(ParamLayout(kTiny), {}, oc, 3, 1, true, DType::BF16);
      const ZeroSizes s = spec.sizes();
      EXPECT_TRUE(s.device);
      EXPECT_EQ(s.sharded, zero == 3);
      EXPECT_EQ(s.per_micro, zero == 3);
      const ZeroHostMemory host = zero_host_memory(s);
      EXPECT_EQ(host.optimizer, 0u);
      EXPECT_EQ(host.staging, 3 * spec.shard_n * sizeof(float));
      EXPECT_EQ(zero_device_memory(s), (3 + (zero == 3) + delayed) * spec.shard_n * sizeof(float));
    }
}

std::vector<float> ramp(size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = scale * static_cast<float>(static_cast<int>(i % 23) - 11) + shift;
  return v;
}

// On one rank the shard is the whole range: the tiled update, uploaded lane by lane or after the fact, is bitwise
// the AdamW kernel run tensor by tensor with each tensor's weight decay, whatever the tiles.
TEST(HostAdamW, TiledUpdateIsThePerTensorUpdate) {
  const ParamLayout layout(kTiny);
  const size_t n = layout.total();
  const std::vector<float> init = ramp(n, 0.01f, 0.3f), g = ramp(n, 0.002f, -0.001f);
  std::vector<float> want = init, m(n, 0.0f), v(n, 0.0f);
  const OptimConfig oc = optim(1, 0.001);
  ops::AdamWHyper h = adamw_hyper(oc, 1e-2, 1, 3.0);
  EXPECT_NEAR(h.grad_scale, 1.0 / (3.0 + 1e-6), 1e-12) << "clipped to grad_clip 1";
  for (const TensorSpec& t : layout.tensors()) {
    ops::AdamWHyper ht = h;
    ht.weight_decay = t.decay ? oc.weight_decay : 0.0;
    ops::adamw_update(&want[t.offset], &m[t.offset], &v[t.offset], &g[t.offset], nullptr, t.numel, ht);
  }
  std::unique_ptr<Communicator> comm = make_local_communicator();
  for (double mb : {0.0, 0.001, 100.0})
    for (bool later : {false, true}) {
      SCOPED_TRACE(strf("bucket_mb %g, %s", mb, later ? "uploaded after the update" : "uploaded tile by tile"));
      CpuBackend backend(backend_spec(layout));
      const ZeroSpec spec(layout, {}, optim(1, mb), 1, 0, true, DType::F32);
      HostBuffers k(backend);
      HostAdamW adamw(spec, layout, backend, k, init.data());
      // Every bucket is announced once, in the order the next forward reads the weights: the reverse of
      // spec.buckets, which is backward's order.
      std::vector<size_t> announced;
      const HostAdamW::BucketUploaded note = [&](const ZeroBucket& b) { announced.push_back(b.offset); };
      std::vector<size_t> forward_order;
      for (auto b = spec.buckets.rbegin(); b != spec.buckets.rend(); ++b) forward_order.push_back(b->offset);
      EXPECT_EQ(std::vector<float>(adamw.master(), adamw.master() + n), init);
      adamw.load_backend();
      std::vector<float> got(n);
      backend.get_params(got.data(), 0, n);
      EXPECT_EQ(got, init);
      EXPECT_EQ(adamw.next_step(), 1);
      if (later) {
        adamw.update(g.data(), h);
        backend.get_params(got.data(), 0, n);
        EXPECT_EQ(got, init) << "update() leaves the backend alone";
        adamw.upload_shard(note);
      } else {
        adamw.update_and_upload(g.data(), h, note);
      }
      EXPECT_EQ(announced, forward_order);
      if (mb == 0.001) {
        EXPECT_GT(announced.size(), 2u) << "a bucket per module";
      }
      backend.get_params(got.data(), 0, n);
      EXPECT_EQ(got, want);
      EXPECT_EQ(std::vector<float>(adamw.master(), adamw.master() + n), want);
      EXPECT_EQ(std::vector<float>(adamw.exp_avg(), adamw.exp_avg() + n), m);
      EXPECT_EQ(std::vector<float>(adamw.exp_avg_sq(), adamw.exp_avg_sq() + n), v);
    }
}

TEST(DelayedUpdate, RunsBesideTheCallerAndRethrowsItsError) {
  DelayedUpdate d;
  EXPECT_FALSE(d.in_flight());
  EXPECT_EQ(d.wait(), 0.0);
  std::atomic<bool> go{false};
  std::thread::id ran_on;
  int team = 0;
  d.start([&] {
    while (!go) std::this_thread::yield();
    ran_on = std::this_thread::get_id();
    team = omp_get_max_threads();
  });
  EXPECT_TRUE(d.in_flight());
  EXPECT_THROW(d.start([] {}), Error) << "one update at a time";
  go = true;
  EXPECT_GE(d.wait(), 0.0);
  EXPECT_FALSE(d.in_flight());
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(team, std::max(1, omp_get_max_threads() - 1)) << "a core is left to the caller";
  d.start([] { throw Error("update failed"); });
  try {
    d.wait();
    ADD_FAILURE() << "the update's error was not rethrown";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "update failed");
  }
  EXPECT_FALSE(d.in_flight());
  EXPECT_EQ(d.wait(), 0.0) << "the error is rethrown once";
  std::atomic<bool> done{false};
  {
    DelayedUpdate e;
    e.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      done = true;
    });
  }
  EXPECT_TRUE(done) << "the destructor waits for the update";
}

}  // namespace
}  // namespace yuan
