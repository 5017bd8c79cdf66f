// Which node every rank of a job runs on, and what that means for its groups: which of them stay inside a node
// (shared memory) and which cross a node boundary (the network). Pure arithmetic over a Topology and a NodeMap, no
// MPI: comm/world.h builds the job's map at start-up, `yuanlm plan --nodes` one of whole nodes.
//
// Topology numbers the ranks with the tensor rank innermost (as Megatron-LM does), so a stage's tensor ranks are
// consecutive; launchers fill a node with consecutive ranks (mpirun --map-by slot, srun's block distribution).
// A node of G ranks then holds whole tensor groups whenever tp_size divides G, and the groups that cross nodes
// are the pipeline and data groups, whose traffic is per micro-batch or per step rather than per layer.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "layout/topology.h"

namespace yuan::layout {

struct NodeMap {
  std::vector<int> node;            // by world rank: the index of its node; nodes are numbered by their lowest rank
  std::vector<std::string> names;   // by node: its name ("" when unknown, as in a plan)

  int nodes() const { return static_cast<int>(names.size()); }
  std::vector<int> ranks_on(int n) const;  // increasing
  // "node 1 (host)", or "node 1" without a name.
  std::string label(int n) const;

  // The job's map from every rank's `leader` (the lowest world rank of its node) and `hosts` (every rank's
  // processor name): a node is named after its leader's processor name, so the ranks of one node agree. Throws
  // Error when a leader is not the lowest rank of its own node.
  static NodeMap from_leaders(const std::vector<int>& leader, const std::vector<std::string>& hosts);
  // `nodes` nodes of `ranks_per_node` consecutive ranks each, as a block distribution fills them.
  static NodeMap blocks(int nodes, int ranks_per_node);
};

// One process group of more than one rank, with the nodes its ranks are on.
struct GroupSpan {
  std::string kind;         // "tensor", "pipeline", "data"
  std::string name;         // as the groups go by in messages (ProcessGroups): tensor[0.1], data[modules 2-5]
  std::vector<int> ranks;   // increasing
  std::vector<int> nodes;   // the nodes of its ranks, increasing
  bool crosses() const { return nodes.size() > 1; }
};

// Every group of `topo` with more than one rank: tensor groups, then pipeline groups, each in order of its lowest
// rank, then data groups by module group and tensor rank. `nodes` covers topo's ranks.
std::vector<GroupSpan> group_spans(const Topology& topo, const NodeMap& nodes);

// "0-3", "0,2..14" (a progression), "0-1,4,6-7": increasing ranks or nodes in few characters.
std::string ranks_text(const std::vector<int>& v);

// The layout as printed at start-up: how the ranks split into replicas or pipelines and what each step runs.
std::vector<std::string> describe_layout(const Config& c, const Topology& topo);
// A header, then each node with its ranks and the groups they are in (groups of one rank, which carry nothing, are
// left out), a group reaching other nodes with those nodes. `spans` are group_spans(topology, nodes).
std::vector<std::string> describe_nodes(const NodeMap& nodes, const std::vector<GroupSpan>& spans);

// One line per kind of group: how many groups it has and which cross a node boundary ("tensor groups: 2, all
// inside a node", "data groups: 2, 2 crossing a node boundary: data[modules 0-6] ranks 0,2 on nodes 0-1; ...").
std::vector<std::string> describe_crossings(const std::vector<GroupSpan>& spans);

// One warning per tensor group that crosses a node boundary, naming it, its ranks and their nodes: its all-reduces
// run in every layer of every pass, at the network's speed instead of shared memory's.
std::vector<std::string> tensor_crossing_warnings(const std::vector<GroupSpan>& spans, const NodeMap& nodes,
                                                  int tp_size);

}  // namespace yuan::layout
