// Tensor parallelism (Megatron-LM's cut) under mpirun with 1 to 4 ranks, all of them one tensor group: each rank's
// part of the parameters is the whole model's values at the places global_runs() names, and the program on the
// parts (column- and row-parallel layers, vocabulary-parallel embedding and cross-entropy) computes the whole
// model's loss and, part by part, its gradients. Tolerances: the ranks' partial products are summed in another
// order than one rank's GEMMs, so fp32 sums differ by rounding, ~1e-7 relative; 1e-5 leaves room.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "comm/groups.h"
#include "comm/world.h"
#include "model/gpt.h"
#include "program/program.h"
#include "test_util.h"
#include "util/rng.h"

namespace yuan {
namespace {

// 12 heads of 2, MLP 96 wide, vocabulary 24: every part splits over 1, 2, 3 and 4 ranks.
const GPTConfig kCfg{2, 12, 24, 6, 24};
constexpr int kB = 2;

std::vector<float> whole_params() {
  const ParamLayout L(kCfg);
  std::vector<float> p(L.total());
  init_gpt2(L, 3, p.data());
  Rng rng(9, 0);
  for (float& x : p) x += 0.2f * (rng.next_uniform() - 0.5f);  // LayerNorms and biases away from 1 and 0
  return p;
}

std::vector<int32_t> tokens() {
  std::vector<int32_t> t(static_cast<size_t>(kB) * (kCfg.seq_len + 1));
  Rng rng(4, 1);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.next_u64() % kCfg.vocab_size);
  return t;
}

TEST(MpiTensorParallel, PartsTileTheModelAndInitialiseAsIt) {
  const int n = comm::world().size, r = comm::world().rank;
  const ParamLayout whole(kCfg), part(kCfg, held_modules(kCfg, all_modules(kCfg)), {r, n});
  std::vector<float> full(whole.total()), mine(part.total());
  init_gpt2(whole, 7, full.data());
  init_gpt2(part, 7, mine.data());
  // Every element of a cut tensor belongs to exactly one rank; a replicated one to all.
  std::vector<double> owners(whole.total(), 0.0);
  for (const ParamLayout::Run& run : part.global_runs(0, part.total()))
    for (size_t i = 0; i < run.count; i++) {
      EXPECT_EQ(mine[run.local + i], full[run.global + i]) << "element " << run.global + i;
      owners[run.global + i] += 1;
    }
  const comm::ProcessGroups groups(layout::Topology::data_parallel(1, module_count(kCfg), 1, n));
  auto comm = comm::make_mpi_communicator(groups.get(comm::Group::World), INT_MAX);
  comm->all_reduce(owners.data(), owners.size(), DType::F64, ReduceOp::Sum);
  // wte, c_attn and c_fc by rows, the two projections by columns (none of them when one rank holds it all).
  for (const TensorSpec& t : whole.tensors()) {
    const bool cut = part.find(t.name).split != TpSplit::Replicated;
    for (size_t i = 0; i < t.numel; i++)
      ASSERT_EQ(owners[t.offset + i], cut ? 1.0 : n) << t.name << " element " << i;
  }
}

TEST(MpiTensorParallel, PartsComputeTheWholeModel) {
  const int n = comm::world().size, r = comm::world().rank;
  const std::vector<float> params = whole_params();
  const std::vector<int32_t> tok = tokens();
  // The whole model on this process.
  const ParamLayout whole_layout(kCfg);
  auto whole = make_backend(Device::Cpu, backend_spec(whole_layout));
  whole->set_params(params.data(), 0, params.size());
  Program one(*whole, whole_layout, {{}, kB, 1, false});
  const float want_loss = one.forward_backward(tok.data(), kB, 1.0f, nullptr);
  std::vector<float> want(whole->size());
  whole->grads_to_host(0, want.size(), want.data());

  // This rank's part of it, the tensor group being the world.
  const comm::ProcessGroups groups(layout::Topology::data_parallel(1, module_count(kCfg), 1, n));
  auto comm = comm::make_mpi_communicator(groups.get(comm::Group::Tensor), INT_MAX);
  const ParamLayout L(kCfg, held_modules(kCfg, all_modules(kCfg)), {r, n});
  auto be = make_backend(Device::Cpu, backend_spec(L));
  std::vector<float> mine(L.total());
  for (const ParamLayout::Run& run : L.global_runs(0, L.total()))
    std::copy_n(params.data() + run.global, run.count, mine.data() + run.local);
  be->set_params(mine.data(), 0, mine.size());
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "activations kept");
    be->zero_grads(0, be->size());
    Program part(*be, L, {{}, kB, 1, recompute, n}, comm.get());
    const float loss = part.forward_backward(tok.data(), kB, 1.0f, nullptr);
    EXPECT_LE(std::fabs(loss - want_loss), 1e-5 * want_loss);
    std::vector<float> got(be->size());
    be->grads_to_host(0, got.size(), got.data());
    // Every tensor's part against the same places of the whole model's gradient.
    for (const TensorSpec& t : L.tensors()) {
      std::vector<float> ref(t.numel), mine_g(got.begin() + t.offset, got.begin() + t.offset + t.numel);
      for (const ParamLayout::Run& run : L.global_runs(t.offset, t.numel))
        std::copy_n(want.data() + run.global, run.count, ref.data() + (run.local - t.offset));
      // Scale: the whole tensor's, so a small part is not judged on its own size.
      const TensorSpec& full = ParamLayout(kCfg).find(t.name);
      double scale = 0, err = 0;
      for (size_t i = 0; i < full.numel; i++) scale = std::max(scale, std::fabs(double(want[full.offset + i])));
      for (size_t i = 0; i < t.numel; i++) err = std::max(err, std::fabs(double(mine_g[i]) - ref[i]));
      EXPECT_LE(err, 1e-5 * scale) << t.name << " on tensor rank " << r << " of " << n;
    }
  }
}

}  // namespace
}  // namespace yuan
