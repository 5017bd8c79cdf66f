// Which node each rank runs on and which groups cross a node boundary (layout/nodes.h), over fake node maps; the
// start-up description of a layout; under mpirun (MpiNodes), the map every rank gathers at init (comm/world.h).
// A job spread over nodes for real is tests/mpi/test_node_layout.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/world.h"
#include "layout/nodes.h"
#include "test_util.h"

namespace yuan::layout {
namespace {

constexpr int kModules = 8;  // wte, wpe, h.0 .. h.4, ln_f

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> crossing(const Topology& t, const NodeMap& nodes) {
  std::vector<std::string> out;
  for (const GroupSpan& g : group_spans(t, nodes))
    if (g.crosses()) out.push_back(g.name + " " + ranks_text(g.ranks));
  return out;
}

TEST(NodeMap, NodesAreNumberedByTheirLowestRankAndNamedByIt) {
  // Two nodes filled in blocks, then round robin (mpirun --map-by node): the leader is each node's lowest rank.
  NodeMap m = NodeMap::from_leaders({0, 0, 2, 2}, {"a", "a", "b", "b"});
  EXPECT_EQ(m.node, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(m.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.ranks_on(1), (std::vector<int>{2, 3}));
  m = NodeMap::from_leaders({0, 1, 0, 1, 0}, {"x", "y", "x", "y", "x"});
  EXPECT_EQ(m.node, (std::vector<int>{0, 1, 0, 1, 0}));
  EXPECT_EQ(m.ranks_on(0), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(m.label(1), "node 1 (y)");
  // Two shared-memory domains with one processor name (containers) stay two nodes.
  EXPECT_EQ(NodeMap::from_leaders({0, 1}, {"vm", "vm"}).nodes(), 2);
  EXPECT_EQ(NodeMap::blocks(2, 3).node, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(NodeMap::blocks(2, 3).label(1), "node 1");
}

TEST(NodeMap, ALeaderOutsideItsNodeIsRefused) {
  EXPECT_TRUE(has(testing::error_of([] { NodeMap::from_leaders({0, 2, 2}, {"a", "b", "b"}); }),
                  "rank 1's node is led by rank 2, which is not a lower rank"));
  EXPECT_TRUE(has(testing::error_of([] { NodeMap::from_leaders({0, 0, 1}, {"a", "a", "a"}); }),
                  "rank 2's node is led by rank 1, which is in another node"));
  EXPECT_TRUE(has(testing::error_of([] { NodeMap::blocks(0, 4); }), "0 nodes of 4 ranks"));
}

TEST(NodeMap, RanksInFewCharacters) {
  EXPECT_EQ(ranks_text({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(ranks_text({5}), "5");
  EXPECT_EQ(ranks_text({0, 2, 4, 6}), "0,2..6");
  EXPECT_EQ(ranks_text({0, 1, 4, 6, 7}), "0-1,4,6-7");
  EXPECT_EQ(ranks_text({1, 3}), "1,3");
}

// Tensor ranks are innermost (Megatron-LM's order), so whole nodes filled in blocks hold whole tensor groups
// whenever tp_size divides the ranks per node, in every layout: the groups that cross are pipelines and data.
TEST(NodeMap, TensorGroupsStayInsideNodesThatHoldWholeOnes) {
  const std::vector<Pipeline> pipes = {{"one", {{0, kModules}}, 2}, {"two", {{0, 4}, {4, kModules}}, 2},
                                       {"two", {{0, 4}, {4, kModules}}, 2}};
  for (int tp : {1, 2, 4, 8})
    for (int per_node : {8, 16}) {
      const Topology layouts[] = {Topology::data_parallel(4, kModules, 1, tp), Topology(pipes, tp, kModules)};
      for (const Topology& t : layouts) {
        if (t.world_size() % per_node) continue;
        const NodeMap nodes = NodeMap::blocks(t.world_size() / per_node, per_node);
        for (const GroupSpan& g : group_spans(t, nodes))
          EXPECT_FALSE(g.kind == "tensor" && g.crosses()) << g.name << " tp " << tp << " on nodes of " << per_node;
        EXPECT_TRUE(tensor_crossing_warnings(group_spans(t, nodes), nodes, tp).empty());
      }
    }
  // The same pipelines with tp 1 (world 5): nothing crosses on one node; on nodes of ranks 0-1 and 2-4, pipeline 1
  // (ranks 1-2) does, pipeline 2 (ranks 3-4) does not, and every module group's data group does.
  const Topology t(pipes, 1, kModules);
  EXPECT_TRUE(crossing(t, NodeMap::blocks(1, 5)).empty());
  const NodeMap two = NodeMap::from_leaders({0, 0, 2, 2, 2}, {"a", "a", "b", "b", "b"});
  EXPECT_EQ(crossing(t, two), (std::vector<std::string>{"pipeline[1] 1-2", "data[module 0] 0-4",
                                                        "data[modules 1-3] 0-1,3", "data[modules 4-7] 0,2..4"}));
}

TEST(NodeMap, ATensorGroupAcrossNodesIsWarnedByNameRanksAndNodes) {
  // 3 replicas of tp 2 on 2 nodes of 3 ranks: tensor[1.0] is ranks 2-3, one on each node.
  const Topology t = Topology::data_parallel(3, kModules, 1, 2);
  const NodeMap nodes = NodeMap::from_leaders({0, 0, 0, 3, 3, 3}, {"n1", "n1", "n1", "n2", "n2", "n2"});
  const std::vector<GroupSpan> spans = group_spans(t, nodes);
  EXPECT_EQ(crossing(t, nodes),
            (std::vector<std::string>{"tensor[1.0] 2-3", "data[modules 0-7] 0,2..4", "data[modules 0-7] 1,3..5"}));
  const std::vector<std::string> w = tensor_crossing_warnings(spans, nodes, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(has(w[0], "tensor group tensor[1.0] (ranks 2-3) crosses a node boundary: its ranks are on node 0 (n1) "
                        "and node 1 (n2)"))
      << w[0];
  EXPECT_TRUE(has(w[0], "a multiple of parallel.tp_size 2")) << w[0];
  const std::vector<std::string> lines = describe_crossings(spans);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "tensor groups: 3, 1 crossing a node boundary: tensor[1.0] ranks 2-3 on nodes 0-1");
  EXPECT_EQ(lines[1], "pipeline groups: none of more than one rank");
  EXPECT_TRUE(has(lines[2], "data groups: 2, 2 crossing a node boundary: data[modules 0-7] ranks 0,2..4 on nodes "
                            "0-1; data[modules 0-7] ranks 1,3..5 on nodes 0-1"))
      << lines[2];
  // Round robin over 2 nodes puts every tensor group across them, even with 2 ranks per node.
  const NodeMap cyclic = NodeMap::from_leaders({0, 1, 0, 1}, {"a", "b", "a", "b"});
  EXPECT_EQ(tensor_crossing_warnings(group_spans(Topology::data_parallel(2, kModules, 1, 2), cyclic), cyclic, 2).size(),
            2u);
}

TEST(NodeMap, ManyCrossingGroupsAreCounted) {
  const Topology t = Topology::data_parallel(20, kModules, 1, 2);
  std::vector<int> leader;
  for (int r = 0; r < 40; r++) leader.push_back(r % 2);  // round robin over 2 nodes: every tensor group crosses
  const NodeMap nodes = NodeMap::from_leaders(leader, std::vector<std::string>(40, "h"));
  const std::string tensor = describe_crossings(group_spans(t, nodes))[0];
  EXPECT_TRUE(has(tensor, "tensor groups: 20, 20 crossing a node boundary: tensor[0.0] ranks 0-1 on nodes 0-1;"))
      << tensor;
  EXPECT_TRUE(has(tensor, "tensor[7.0] ranks 14-15 on nodes 0-1; and 12 more")) << tensor;
}

Config tiny() {
  Config c;
  c.model = GPTConfig{5, 2, 16, 8, 32};
  c.train.micro_batch = 2;
  c.train.global_batch = 8;
  return c;
}

// Data-parallel replicas have no template name: they print as replicas, never as "pipeline 0 (, ...)".
TEST(DescribeLayout, ReplicasAndPipelines) {
  Config c = tiny();
  std::vector<std::string> lines = describe_layout(c, Topology::data_parallel(4, kModules, 1));
  EXPECT_EQ(lines, std::vector<std::string>{
                       "parallel: 4 ranks x 2 micro-batch x 1 accumulation = 8 sequences/step (data parallel)"});
  lines = describe_layout(c, Topology::data_parallel(2, kModules, 2, 2));
  EXPECT_EQ(lines, std::vector<std::string>{"parallel: 4 ranks as 2 replicas of tp 2 x 2 micro-batch x 2 "
                                            "accumulation = 8 sequences/step (data parallel)"});
  const std::vector<Pipeline> pipes = {{"one", {{0, kModules}}, 2}, {"two", {{0, 4}, {4, kModules}}, 2}};
  lines = describe_layout(c, Topology(pipes, 2, kModules));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "parallel: 6 ranks in 2 pipelines, 1f1b schedule, 8 sequences/step:");
  EXPECT_EQ(lines[1], "  pipeline 0 (one, 2 micro-batches of 2): ranks 0-1: wte, wpe, h.0-h.4, ln_f");
  EXPECT_EQ(lines[2],
            "  pipeline 1 (two, 2 micro-batches of 2): ranks 2-3: wte, wpe, h.0-h.1 | ranks 4-5: h.2-h.4, ln_f");
}

TEST(DescribeLayout, EachNodeWithItsRanksAndGroups) {
  const Topology t = Topology::data_parallel(2, kModules, 1, 2);
  const NodeMap nodes = NodeMap::from_leaders({0, 0, 2, 2}, {"a", "a", "b", "b"});
  const std::vector<std::string> lines = describe_nodes(nodes, group_spans(t, nodes));
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "nodes: 2 of 2 ranks",
                       "  node 0 (a): ranks 0-1; tensor[0.0] ranks 0-1; data[modules 0-7] ranks 0,2 across nodes 0-1; "
                       "data[modules 0-7] ranks 1,3 across nodes 0-1",
                       "  node 1 (b): ranks 2-3; tensor[1.0] ranks 2-3; data[modules 0-7] ranks 0,2 across nodes 0-1; "
                       "data[modules 0-7] ranks 1,3 across nodes 0-1"}));
  const NodeMap uneven = NodeMap::from_leaders({0, 1, 1, 1}, {"a", "b", "b", "b"});
  EXPECT_EQ(describe_nodes(uneven, group_spans(t, uneven))[0], "nodes: 2");
}

// Every rank gathers the same map at init; on one host (as the tests run) all ranks share node 0, named after it.
TEST(MpiNodes, EveryRankKnowsItsNode) {
  const comm::WorldInfo& w = comm::world();
  const NodeMap& m = comm::node_map();
  ASSERT_EQ(static_cast<int>(m.node.size()), w.size);
  EXPECT_EQ(m.node[w.rank], w.node);
  EXPECT_EQ(static_cast<int>(m.ranks_on(w.node).size()), w.local_size);
  EXPECT_EQ(m.ranks_on(w.node)[w.local_rank], w.rank);
  int size = 0;
  const std::vector<unsigned long long> both = {1ull * w.local_size, 2ull * w.local_size};
  EXPECT_EQ(comm::sum_on_node({1, 2}, "node", &size), both);
  EXPECT_EQ(size, w.local_size);
  // The node's ranks of one parity of their local rank: as many as there are, each counted once.
  const int parity = w.local_rank % 2, same = (w.local_size + 1 - parity) / 2;
  EXPECT_EQ(comm::sum_on_node({1}, parity, "parity", &size), std::vector<unsigned long long>{1ull * same});
  EXPECT_EQ(size, same);
  // The names agree everywhere: rank 0's map, as every rank holds it.
  std::string all;
  for (int n = 0; n < m.nodes(); n++) all += m.names[n] + ";" + ranks_text(m.ranks_on(n)) + "\n";
  const std::string root = comm::broadcast_string(all, 0);
  EXPECT_EQ(all, root);
}

}  // namespace
}  // namespace yuan::layout
