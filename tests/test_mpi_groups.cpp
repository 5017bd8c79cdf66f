// Process groups under mpirun (1 to 4 ranks): the MPI communicators made from a Topology hold exactly the ranks the
// topology names, a Communicator scoped to a group reduces over its members only, and send_recv moves data between
// neighbours in both directions at once without waiting on each other.
#include <gtest/gtest.h>

#include <climits>
#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_group.h"
#include "comm/world.h"

namespace yuan::comm {
namespace {

using layout::Pipeline;
using layout::Topology;

constexpr int kModules = 6;

// A layout with pipelines for every world size the runner uses: 1 rank data parallel, 2 ranks one 2-stage
// pipeline, 3 ranks a 1-stage beside a 2-stage pipeline, 4 ranks two 2-stage pipelines cut differently.
Topology layout_for(int world) {
  switch (world) {
    case 1: return Topology::data_parallel(1, kModules, 1);
    case 2: return Topology({{"two", {{0, 3}, {3, kModules}}, 2}}, 1, kModules);
    case 3: return Topology({{"one", {{0, kModules}}, 1}, {"two", {{0, 3}, {3, kModules}}, 2}}, 1, kModules);
    default: {
      std::vector<Pipeline> p = {{"a", {{0, 3}, {3, kModules}}, 1}, {"b", {{0, 4}, {4, kModules}}, 1}};
      for (int extra = 4; extra < world; extra++) p.push_back({"dp", {{0, kModules}}, 1});
      return Topology(std::move(p), 1, kModules);
    }
  }
}

// The world ranks of a group's MPI communicator, by group rank, as MPI itself sees them.
std::vector<int> members(const ProcessGroup& g) {
  std::vector<int> out(static_cast<size_t>(g.size()));
  const int me = world().rank;
  MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, g.mpi().comm));
  return out;
}

TEST(MpiGroups, EachGroupHoldsTheRanksTheTopologyNames) {
  const int rank = world().rank;
  const ProcessGroups groups(layout_for(world().size));
  const Topology& t = groups.topology();
  EXPECT_EQ(members(groups.get(Group::World)), t.world_ranks());
  EXPECT_EQ(members(groups.get(Group::Pipeline)), t.pipeline_ranks(rank));
  EXPECT_EQ(members(groups.get(Group::Tensor)), t.tensor_ranks(rank));
  const std::vector<ModuleRange> mine = t.module_groups_of(rank);
  ASSERT_EQ(groups.data_modules(), mine);
  for (size_t i = 0; i < mine.size(); i++) {
    const ProcessGroup& g = groups.get(Group::Data, static_cast<int>(i));
    EXPECT_EQ(members(g), t.holders(mine[i].first, t.place(rank).tp_rank)) << g.name();
    EXPECT_EQ(g.world_ranks(), members(g));
  }
  EXPECT_THROW(groups.get(Group::Data, static_cast<int>(mine.size())), Error);
}

// Each data group's all-reduce sums over the holders of its modules and nobody else.
TEST(MpiGroups, ScopedCollectivesReduceOverTheGroupOnly) {
  const int rank = world().rank;
  const ProcessGroups groups(layout_for(world().size));
  for (size_t i = 0; i < groups.data_modules().size(); i++) {
    const ProcessGroup& g = groups.get(Group::Data, static_cast<int>(i));
    for (size_t chunk : {size_t(INT_MAX), size_t(2)}) {
      auto comm = make_mpi_communicator(g, chunk);
      EXPECT_EQ(comm->rank(), g.rank());
      EXPECT_EQ(comm->size(), g.size());
      std::vector<double> v = {rank + 1.0, 10.0 * rank, 1.0};
      comm->all_reduce(v.data(), v.size(), DType::F64, ReduceOp::Sum);
      double want0 = 0, want1 = 0;
      for (int r : g.world_ranks()) want0 += r + 1.0, want1 += 10.0 * r;
      EXPECT_EQ(v, (std::vector<double>{want0, want1, static_cast<double>(g.size())})) << g.name();
      EXPECT_EQ(comm->sum(1.0), g.size());
    }
  }
}

// The groups make a group's communicator on first ask and keep it; a group with the world's members shares the
// world's, and its traffic then counts for that group. A ZeRO-3 gather communicator is the data group's own copy,
// counted as data traffic.
TEST(MpiGroups, CommunicatorsAreKeptAndCountTheirGroupsTraffic) {
  ProcessGroups groups(layout_for(world().size));
  EXPECT_THROW(groups.communicator(Group::World), Error);  // no device set yet
  groups.set_device(Device::Cpu, nullptr, 60);
  Communicator& w = groups.communicator(Group::World);
  EXPECT_EQ(&w, &groups.communicator(Group::World));
  Communicator& p = groups.communicator(Group::Pipeline);
  const bool shared = groups.get(Group::Pipeline).world_ranks() == groups.get(Group::World).world_ranks();
  EXPECT_EQ(&p == &w, shared);
  EXPECT_EQ(&p, &groups.communicator(Group::Pipeline));
  EXPECT_THROW(groups.set_device(Device::Cpu, nullptr, 60), Error);  // after a communicator was made

  const auto all_reduce_bytes = [&](Group g) {
    return groups.traffic()[static_cast<int>(g)].bytes[static_cast<int>(CommOp::AllReduce)];
  };
  std::vector<float> v(64, 1.0f);
  w.all_reduce(v.data(), v.size(), DType::F32, ReduceOp::Sum);
  EXPECT_EQ(v[0], static_cast<float>(world().size));
  const bool moved = world().size > 1;  // one rank sends nothing
  EXPECT_EQ(all_reduce_bytes(Group::World) > 0, moved && !shared);
  EXPECT_EQ(all_reduce_bytes(Group::Pipeline) > 0, moved && shared);

  for (size_t i = 0; i < groups.data_modules().size(); i++) {
    const int index = static_cast<int>(i);
    const uint64_t before = groups.traffic()[static_cast<int>(Group::Data)].bytes[static_cast<int>(CommOp::AllGather)];
    std::unique_ptr<Communicator> gathers = groups.gather_communicator(index);
    EXPECT_NE(gathers.get(), &groups.communicator(Group::Data, index));
    const int n = groups.get(Group::Data, index).size();
    std::vector<float> blocks(static_cast<size_t>(n) * 4, 0.0f);
    for (int k = 0; k < 4; k++) blocks[static_cast<size_t>(gathers->rank()) * 4 + k] = gathers->rank() + 1.0f;
    gathers->all_gather(blocks.data(), std::vector<size_t>(static_cast<size_t>(n), 4), DType::F32);
    for (int r = 0; r < n; r++) EXPECT_EQ(blocks[static_cast<size_t>(r) * 4], r + 1.0f);
    const uint64_t after = groups.traffic()[static_cast<int>(Group::Data)].bytes[static_cast<int>(CommOp::AllGather)];
    EXPECT_EQ(after > before, n > 1);
  }
}

// Every rank sends to the next and receives from the previous one in one call (a ring, both directions at once
// for two ranks), in chunks smaller than the message (3 bytes, splitting values) so that the chunk loop runs. The
// sends are synchronous: a ring of separate sends and receives would deadlock.
TEST(MpiSendRecv, RingExchangeInBothDirectionsAtOnce) {
  const int n = world().size, rank = world().rank;
  const ProcessGroups groups(layout_for(n));
  for (size_t chunk : {size_t(INT_MAX), size_t(3)}) {
    auto comm = make_mpi_communicator(groups.get(Group::World), chunk);
    if (n == 1) {  // no neighbour: an exchange with oneself is refused, not left to hang
      float x = 0;
      EXPECT_THROW(comm->send_recv(&x, sizeof x, 0, &x, sizeof x, 0), Error);
      continue;
    }
    const size_t count = 11;
    std::vector<float> out(count), in(count, -1.0f);
    for (size_t i = 0; i < count; i++) out[i] = static_cast<float>(rank * 100 + i);
    comm->send_recv(out.data(), count * sizeof(float), (rank + 1) % n, in.data(), count * sizeof(float),
                    (rank + n - 1) % n);
    const int from = (rank + n - 1) % n;
    for (size_t i = 0; i < count; i++) ASSERT_EQ(in[i], static_cast<float>(from * 100 + i)) << "chunk " << chunk;
  }
}

// Along each pipeline: stage s sends forward to s+1, which answers backward with twice the values, as pipeline
// stages pass activations and gradients.
TEST(MpiSendRecv, PipelineNeighboursPassForwardAndBack) {
  const ProcessGroups groups(layout_for(world().size));
  const ProcessGroup& pipe = groups.get(Group::Pipeline);
  auto comm = make_mpi_communicator(pipe, INT_MAX);
  const int s = pipe.rank(), stages = pipe.size();
  std::vector<int32_t> act(5, -1), grad(5, -1);
  if (s > 0) comm->recv(act.data(), act.size(), DType::I32, s - 1);
  else std::iota(act.begin(), act.end(), 7);
  if (s + 1 < stages) {
    comm->send(act.data(), act.size(), DType::I32, s + 1);
    comm->recv(grad.data(), grad.size(), DType::I32, s + 1);
  } else {
    for (size_t i = 0; i < act.size(); i++) grad[i] = 2 * act[i];
  }
  if (s > 0) comm->send(grad.data(), grad.size(), DType::I32, s - 1);
  for (size_t i = 0; i < act.size(); i++) {
    EXPECT_EQ(act[i], static_cast<int32_t>(7 + i)) << "stage " << s;
    EXPECT_EQ(grad[i], static_cast<int32_t>(2 * (7 + i))) << "stage " << s;
  }
  if (stages == 1) {
    EXPECT_THROW(comm->send(act.data(), act.size(), DType::I32, 0), Error);
  }
}

}  // namespace
}  // namespace yuan::comm
