// The units of the ZeRO optimizer (optim/zero.h) that communicate, each on its own under mpirun with 1 to 4 ranks:
// the gradient buckets reducing into the host gradient, and ZeRO-3's parameter gathering. Values are small
// integers, so that every sum over the ranks is exact whatever its order.
#include <gtest/gtest.h>

#include <climits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_backend.h"
#include "comm/groups.h"
#include "comm/world.h"
#include "optim/zero.h"

namespace yuan {
namespace {

// 3 blocks, so that backward needs a third buffer for the blocks; 12-token vocabulary, uneven shards.
const GPTConfig kCfg{3, 2, 8, 4, 12};

int rank() { return comm::world().rank; }
int nranks() { return comm::world().size; }

std::unique_ptr<Communicator> world_comm(bool duplicate = false) {
  static const comm::ProcessGroups groups(layout::Topology::data_parallel(nranks(), module_count(kCfg), 1));
  return comm::make_mpi_communicator(groups.get(comm::Group::Data), INT_MAX, duplicate);
}

OptimConfig optim(int zero, double bucket_mb) {
  OptimConfig oc;
  oc.zero = ZeroStage(zero);
  oc.bucket_mb = bucket_mb;
  return oc;
}

// Rank r's gradient of parameter i in micro-batch k.
float grad_value(int r, int k, size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1) + k); }
double reduced(int k_count, size_t i) {
  double s = 0;
  for (int r = 0; r < nranks(); r++)
    for (int k = 0; k < k_count; k++) s += grad_value(r, k, i);
  return s;
}

// Each micro-batch adds its gradient and reports the modules in backward's order; the host gradient then holds
// the sum over ranks and micro-batches of this rank's shard (every element at zero 0), the backend's gradients are
// zeroed, and the ranks' norm shares sum to the reduced gradient's squared norm.
TEST(MpiGradientBuckets, ReduceTheShardIntoTheHostGradient) {
  const ParamLayout layout(kCfg);
  const size_t n = layout.total();
  std::unique_ptr<Communicator> comm = world_comm();
  double want_norm2 = 0;
  for (int accum : {1, 3})
    for (int zero : {0, 1, 2})
      for (double mb : {0.0, 0.001, 100.0})
        for (bool announce : {false, true}) {
          SCOPED_TRACE(strf("zero %d, bucket_mb %g, accum %d, last announced %d", zero, mb, accum, announce));
          CpuBackend backend(backend_spec(layout));
          const ZeroSpec spec(layout, {}, optim(zero, mb), nranks(), rank(), true, DType::F32);
          HostBuffers k(backend);
          HostGradient host(k, spec.sizes());
          double comm_seconds = 0;
          GradientBuckets buckets(spec, layout, backend, *comm, host, comm_seconds);
          float* g = backend.grads().as<float>();
          for (int micro = 0; micro < accum; micro++) {
            if (announce && micro == accum - 1) buckets.before_last_micro_batch();
            for (int m = module_count(kCfg) - 1; m >= 0; m--) {
              const ModuleSpec& mod = layout.module(m);
              for (size_t i = mod.offset; i < mod.offset + mod.numel; i++) g[i] += grad_value(rank(), micro, i);
              buckets.module_ready(m);
            }
            buckets.after_micro_batch();
          }
          EXPECT_EQ(host.micro_batches(), accum);
          buckets.reduce();
          EXPECT_EQ(host.micro_batches(), 0);
          ASSERT_EQ(host.size(), spec.shard_n);
          for (size_t i = 0; i < spec.shard_n; i++)
            ASSERT_EQ(host.current()[i], reduced(accum, spec.shard_off + i)) << "element " << i;
          for (size_t i = 0; i < n; i++) ASSERT_EQ(g[i], 0.0f) << "backend gradient left at " << i;
          want_norm2 = 0;
          for (size_t i = 0; i < n; i++) want_norm2 += reduced(accum, i) * reduced(accum, i);
          EXPECT_DOUBLE_EQ(comm->sum(buckets.norm_share(Tensor())), want_norm2);
        }
}

TEST(MpiGradientBuckets, EveryModuleOnceAMicroBatch) {
  const ParamLayout layout(kCfg);
  std::unique_ptr<Communicator> comm = world_comm();
  CpuBackend backend(backend_spec(layout));
  const ZeroSpec spec(layout, {block_module(0), module_count(kCfg)}, optim(1, 0), nranks(), rank(), true,
                      DType::F32);
  HostBuffers k(backend);
  HostGradient host(k, spec.sizes());
  double comm_seconds = 0;
  GradientBuckets buckets(spec, layout, backend, *comm, host, comm_seconds);
  EXPECT_THROW(buckets.module_ready(kWteModule), Error);  // outside its modules
  EXPECT_THROW(buckets.reduce(), Error);                  // no micro-batch yet
  buckets.module_ready(block_module(2));
  EXPECT_THROW(buckets.module_ready(block_module(2)), Error);  // twice
  EXPECT_THROW(buckets.reduce(), Error);                       // inside a micro-batch
  EXPECT_THROW(buckets.after_micro_batch(), Error);            // the other modules never reported
}

// ZeRO-3: forward finds every module gathered whole from the ranks' blocks; backward's gradients, written into the
// module buffers, reach this rank's pieces of the host gradient summed over the ranks.
TEST(MpiZero3Params, GatherEachModuleAndReduceScatterItsGradient) {
  const ParamLayout layout(kCfg);
  const size_t n = layout.total();
  std::vector<float> whole(n);
  for (size_t i = 0; i < n; i++) whole[i] = 0.5f * static_cast<float>(i % 101);
  for (bool thread : {false, true}) {
    SCOPED_TRACE(thread ? "gathers on a thread" : "gathers in the caller");
    std::unique_ptr<Communicator> comm = world_comm();
    const ZeroSpec spec(layout, {}, optim(3, 0), nranks(), rank(), true, DType::F32);
    std::unique_ptr<Backend> backend = make_backend(Device::Cpu, backend_spec(layout, spec.shard_n));
    for (const ZeroSpec::Piece& p : spec.pieces) backend->set_params(whole.data() + p.layout, p.host, p.count);
    HostBuffers k(*backend);
    HostGradient host(k, spec.sizes());
    double comm_seconds = 0;
    Zero3Params z(spec, layout, *backend, *comm, host, nullptr, comm_seconds, thread ? world_comm(true) : nullptr);
    for (int m = 0; m < module_count(kCfg); m++) {
      z.acquire(m, false);
      for (const TensorSpec& t : layout.tensors()) {
        if (t.module != m) continue;
        const float* w = static_cast<const float*>(z.weight(t).data);
        for (size_t j = 0; j < t.numel; j++) ASSERT_EQ(w[j], whole[t.offset + j]) << t.name << " at " << j;
      }
      z.release(m);
    }
    for (int m = module_count(kCfg) - 1; m >= 0; m--) {
      z.acquire(m, true);
      for (const TensorSpec& t : layout.tensors()) {
        if (t.module != m) continue;
        float* g = static_cast<float*>(z.grad(t).data);
        for (size_t j = 0; j < t.numel; j++) {
          ASSERT_EQ(g[j], 0.0f) << "a module's gradient starts at zero";
          g[j] = grad_value(rank(), 0, t.offset + j);
        }
      }
      z.release(m);
      z.module_ready(m);
    }
    z.after_micro_batch();
    comm->synchronize();
    backend->wait_transfers();
    for (const ZeroSpec::Piece& p : spec.pieces)
      for (size_t j = 0; j < p.count; j++)
        ASSERT_EQ(host.current()[p.host + j], reduced(1, p.layout + j)) << "element " << p.layout + j;
    z.weights_changed();
    const TensorSpec& wte = layout.tensors().front();
    z.acquire(kWteModule, false);
    EXPECT_EQ(static_cast<const float*>(z.weight(wte).data)[1], whole[wte.offset + 1]) << "gathered again";
    z.release(kWteModule);
  }
}

}  // namespace
}  // namespace yuan
