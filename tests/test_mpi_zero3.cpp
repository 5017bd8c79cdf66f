// ZeRO-3 under mpirun with 1 to 4 ranks: the backend holds this rank's shard of every module and the optimizer,
// as the program's ParamSource, gathers each module where a pass reads it and reduce-scatters its gradient when
// backward reports it. Checked against ZeRO-2 driving the same program on whole weights; tolerance 1e-6 relative
// because the per-module reductions may sum the ranks' values in another order than ZeRO-2's buckets (bitwise
// equal on 2 ranks, where a + b = b + a).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/groups.h"
#include "comm/world.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "test_util.h"
#include "util/memory.h"
#include "util/rng.h"

namespace yuan {
namespace {

// 3 blocks, so that backward finds the blocks' two buffers holding what forward left there and needs a third.
const GPTConfig kCfg{3, 2, 8, 4, 12};
constexpr int kB = 2, kMicro = 2, kSteps = 3;

int rank() { return comm::world().rank; }
int nranks() { return comm::world().size; }

std::unique_ptr<Communicator> world_comm(bool duplicate = false) {
  static const comm::ProcessGroups groups(layout::Topology::data_parallel(nranks(), module_count(kCfg), 1));
  return comm::make_mpi_communicator(groups.get(comm::Group::Data), INT_MAX, duplicate);
}

OptimConfig optim(int zero) {
  OptimConfig oc;
  oc.zero = ZeroStage(zero);
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.grad_clip = 1.0;
  oc.eps = 1e-5;
  oc.bucket_mb = 0.001;
  return oc;
}

std::vector<int32_t> batch(int step, int micro) {
  std::vector<int32_t> t(static_cast<size_t>(kB) * (kCfg.seq_len + 1));
  Rng rng(static_cast<uint64_t>(100 * step + 10 * micro + rank()), 3);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_u64() % kCfg.vocab_size);
  return t;
}

// A replica at `zero` (optim/replica.h): the backend (sharded at 3), its optimizer and the program reading through
// it; with `thread`, ZeRO-3 gathers on a communication thread.
struct ZeroReplica {
  std::unique_ptr<Communicator> comm = world_comm();
  Replica r;
  ZeroOptimizer* opt = nullptr;

  ZeroReplica(int zero, bool recompute, bool thread = false) {
    const ParamLayout layout(kCfg);
    std::optional<size_t> shards;
    if (zero == 3) shards = zero_shard_elements(layout, {}, nranks(), rank(), ZeroStage(3));
    std::vector<float> init(layout.total());
    init_gpt2(layout, 11, init.data());
    assemble_replica(r, {Device::Cpu, layout, backend_spec(layout, shards), ProgramSpec{{}, kB, 1, recompute}},
                     [&](Replica& rr) -> Communicator* {
      rr.opts->add(std::make_unique<ZeroOptimizer>(optim(zero), *rr.backend, layout, *comm, init.data(),
                                                   ModuleRange{}, true, thread ? world_comm(true) : nullptr));
      return nullptr;
    });
    opt = r.opts->all().front().get();
  }

  // The trainer's step; returns the mean loss over the micro-batches of this rank.
  double step(int s) {
    double loss = 0;
    for (int k = 0; k < kMicro; k++) {
      const std::vector<int32_t> tok = batch(s, k);
      loss += r.program->forward_backward(tok.data(), kB, 1.0f / (kMicro * nranks()), opt->ready_hook());
      opt->after_micro_batch();
    }
    end_step(*opt, *comm, 1e-2);
    return loss / kMicro;
  }
};

TEST(MpiZero3, MatchesZero2ThroughTheProgram) {
  ASSERT_TRUE(comm::world().thread_multiple) << "Open MPI gives MPI_THREAD_MULTIPLE";
  for (auto [recompute, thread] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE(std::string(recompute ? "recompute" : "activations kept") +
                 (thread ? ", gathers on a thread" : ", gathers in the caller"));
    ZeroReplica z2(2, recompute), z3(3, recompute, thread);
    for (int s = 0; s < kSteps; s++) {
      const double want = z2.step(s), got = z3.step(s);
      EXPECT_LE(std::fabs(got - want), 1e-6 * std::fabs(want)) << "loss of step " << s;
    }
    // The forward of the updated weights, gathered afresh, and the shard against ZeRO-2's whole weights.
    const std::vector<int32_t> tok = batch(kSteps, 0);
    const float want = z2.r.program->forward_loss(tok.data(), kB), got = z3.r.program->forward_loss(tok.data(), kB);
    EXPECT_LE(std::fabs(got - want), 1e-6 * std::fabs(want)) << "loss after the last update";
    std::vector<float> whole(z2.r.backend->size());
    z2.r.backend->get_params(whole.data(), 0, whole.size());
    size_t at = 0;
    double err = 0;
    for (const ShardPiece& p : z3.opt->shard_pieces())
      for (size_t i = 0; i < p.count; i++, at++)
        err = std::max(err, std::fabs(double(z3.opt->master()[at]) - whole[p.model_offset + i]));
    EXPECT_EQ(at, z3.opt->shard_size());
    EXPECT_LE(err, 1e-6);
  }
}

TEST(MpiZero3, DeviceMemoryIsTheShardAndTheModuleBuffers) {
  const ParamLayout layout(kCfg);
  const size_t params0 = mem_bytes(Mem::Params), grads0 = mem_bytes(Mem::Grads);
  {
    ZeroReplica z3(3, false);
    EXPECT_TRUE(z3.r.backend->sharded());
    EXPECT_FALSE(z3.r.backend->grads());
    const ParamMemory plan = zero_param_memory(layout, z3.r.backend->size());
    // The CPU backend keeps fp32 weights: shard plus gathered modules under Params, their gradients under Grads.
    EXPECT_EQ(mem_bytes(Mem::Params) - params0, plan.weights * sizeof(float));
    EXPECT_EQ(mem_bytes(Mem::Grads) - grads0, plan.grads * sizeof(float));
    // wte, wpe, ln_f and two blocks, whatever the number of ranks.
    EXPECT_EQ(plan.grads, layout.module(kWteModule).numel + layout.module(kWpeModule).numel +
                              layout.module(ln_f_module(kCfg)).numel + 2 * layout.module(block_module(0)).numel);
    // The shards tile every module.
    EXPECT_EQ(z3.comm->sum(static_cast<double>(z3.r.backend->size())), static_cast<double>(layout.total()));
  }
  EXPECT_EQ(mem_bytes(Mem::Params), params0);
  EXPECT_EQ(mem_bytes(Mem::Grads), grads0);
}

TEST(MpiZero3, MisuseIsAnError) {
  const ParamLayout layout(kCfg);
  const TensorSpec& qkv = layout.block(1, kQkvW);
  {
    ZeroReplica z3(3, false);
    ZeroOptimizer& opt = *z3.opt;
    EXPECT_THROW(opt.weight(qkv), Error);  // never acquired
    EXPECT_THROW(opt.release(block_module(1)), Error);
    opt.acquire(block_module(1), false);
    EXPECT_EQ(opt.weight(qkv).numel(), qkv.numel);
    EXPECT_THROW(opt.grad(qkv), Error);  // acquired for forward only
    opt.release(block_module(1));
    EXPECT_THROW(opt.weight(qkv), Error);  // released
    opt.ready_hook()(block_module(2));  // reported without its gradient taken: found when the reduction goes out
    EXPECT_THROW(opt.acquire(block_module(0), true), Error);
  }
  // Stage 3 needs a sharded backend, and the other stages a whole one.
  auto comm = world_comm();
  std::vector<float> init(layout.total());
  auto whole = make_backend(Device::Cpu, backend_spec(layout));
  EXPECT_THROW(ZeroOptimizer(optim(3), *whole, layout, *comm, init.data()), Error);
  auto sharded =
      make_backend(Device::Cpu, backend_spec(layout, zero_shard_elements(layout, {}, nranks(), rank(), ZeroStage(3))));
  EXPECT_THROW(ZeroOptimizer(optim(2), *sharded, layout, *comm, init.data()), Error);
  EXPECT_THROW(ZeroOptimizer(optim(1), *whole, layout, *comm, init.data()).acquire(kWteModule, false), Error);
  // The layout must be the one the backend's buffers hold.
  EXPECT_NE(testing::error_of([&] { ZeroOptimizer(optim(1), *whole, ParamLayout(kCfg, {0, 1, 2}), *comm,
                                                  init.data()); }).find("do not hold the layout's"),
            std::string::npos);
}

}  // namespace
}  // namespace yuan
