#include "layout/nodes.h"

#include <algorithm>
#include <set>

#include "layout/layout.h"
#include "util/error.h"

namespace yuan::layout {

std::vector<int> NodeMap::ranks_on(int n) const {
  std::vector<int> r;
  for (int rank = 0; rank < static_cast<int>(node.size()); rank++)
    if (node[rank] == n) r.push_back(rank);
  return r;
}

std::string NodeMap::label(int n) const {
  YUAN_CHECK(n >= 0 && n < nodes(), "node map: node %d of %d", n, nodes());
  return names[n].empty() ? strf("node %d", n) : strf("node %d (%s)", n, names[n].c_str());
}

NodeMap NodeMap::from_leaders(const std::vector<int>& leader, const std::vector<std::string>& hosts) {
  YUAN_CHECK(leader.size() == hosts.size(), "node map: %zu leaders for %zu ranks", leader.size(), hosts.size());
  NodeMap m;
  std::vector<int> index(leader.size(), -1);  // by leader rank: its node's index
  for (int r = 0; r < static_cast<int>(leader.size()); r++) {
    const int l = leader[r];
    // A node's ranks are numbered after its leader's, and the leader leads itself: every rank reached its node.
    YUAN_CHECK(l >= 0 && l <= r && leader[l] == l, "node map: rank %d's node is led by rank %d, which %s", r, l,
               l < 0 || l > r ? "is not a lower rank" : "is in another node");
    if (l == r) {
      index[r] = m.nodes();
      m.names.push_back(hosts[r]);
    }
    m.node.push_back(index[l]);
  }
  return m;
}

NodeMap NodeMap::blocks(int nodes, int ranks_per_node) {
  YUAN_CHECK(nodes >= 1 && ranks_per_node >= 1, "node map: %d nodes of %d ranks", nodes, ranks_per_node);
  NodeMap m;
  m.names.assign(static_cast<size_t>(nodes), "");
  for (int n = 0; n < nodes; n++) m.node.insert(m.node.end(), static_cast<size_t>(ranks_per_node), n);
  return m;
}

namespace {

GroupSpan span(const char* kind, std::string name, std::vector<int> ranks, const NodeMap& nodes) {
  std::set<int> on;
  for (int r : ranks) on.insert(nodes.node.at(static_cast<size_t>(r)));
  return {kind, std::move(name), std::move(ranks), {on.begin(), on.end()}};
}

// `labels` joined as "A, B and C".
std::string listed(const std::vector<std::string>& labels) {
  std::string out;
  for (size_t i = 0; i < labels.size(); i++)
    out += (i == 0 ? "" : i + 1 == labels.size() ? " and " : ", ") + labels[i];
  return out;
}

}  // namespace

std::vector<GroupSpan> group_spans(const Topology& topo, const NodeMap& nodes) {
  YUAN_CHECK(static_cast<int>(nodes.node.size()) == topo.world_size(), "node map of %zu ranks for a layout of %d",
             nodes.node.size(), topo.world_size());
  std::vector<GroupSpan> tensor, pipeline, data;
  for (int rank = 0; rank < topo.world_size(); rank++) {
    const Place& p = topo.place(rank);
    // A group is visited at its lowest rank: the first tensor rank of a stage, the first stage of a pipeline.
    if (p.tp_rank == 0 && topo.tp_size() > 1)
      tensor.push_back(span("tensor", tensor_group_name(p), topo.tensor_ranks(rank), nodes));
    if (p.stage == 0 && topo.stages_of(rank) > 1)
      pipeline.push_back(span("pipeline", pipeline_group_name(p), topo.pipeline_ranks(rank), nodes));
  }
  for (const ModuleRange& g : topo.module_groups())
    for (int t = 0; t < topo.tp_size(); t++) {
      std::vector<int> holders = topo.holders(g.first, t);
      if (holders.size() > 1) data.push_back(span("data", data_group_name(g), std::move(holders), nodes));
    }
  std::vector<GroupSpan> all = std::move(tensor);
  all.insert(all.end(), pipeline.begin(), pipeline.end());
  all.insert(all.end(), data.begin(), data.end());
  return all;
}

std::string ranks_text(const std::vector<int>& v) {
  // A progression of three or more with a step above one, as the data groups of tensor-parallel layouts are.
  if (v.size() >= 3 && v[1] - v[0] > 1) {
    bool progression = true;
    for (size_t i = 2; i < v.size() && progression; i++) progression = v[i] - v[i - 1] == v[1] - v[0];
    if (progression) return strf("%d,%d..%d", v[0], v[1], v.back());
  }
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) j++;
    out += (out.empty() ? "" : ",") + (j == i ? strf("%d", v[i]) : strf("%d-%d", v[i], v[j]));
    i = j + 1;
  }
  return out;
}

std::vector<std::string> describe_layout(const Config& c, const Topology& topo) {
  std::vector<std::string> lines;
  const std::vector<Pipeline>& pipelines = topo.pipelines();
  const int T = topo.tp_size();
  // Replicas made by data parallelism have no template (layout.h make_topology), so no name to show.
  if (topo.replicas_only() && pipelines[0].name.empty()) {
    const std::string replicas = T == 1 ? "" : strf(" as %zu replicas of tp %d", pipelines.size(), T);
    lines.push_back(strf("parallel: %d ranks%s x %d micro-batch x %d accumulation = %d sequences/step (data parallel)",
                         topo.world_size(), replicas.c_str(), c.train.micro_batch, pipelines[0].micro_batches,
                         c.train.global_batch));
  } else {
    lines.push_back(strf("parallel: %d ranks in %zu pipelines, %s schedule, %d sequences/step:", topo.world_size(),
                         pipelines.size(), c.parallel.schedule.c_str(), c.train.global_batch));
    for (size_t p = 0; p < pipelines.size(); p++) {
      const Pipeline& pl = pipelines[p];
      std::string stages;
      for (size_t s = 0; s < pl.stages.size(); s++) {
        const int first = topo.rank_of({static_cast<int>(p), static_cast<int>(s), 0});
        stages += strf("%s %s: %s", s ? " |" : "", T == 1 ? strf("rank %d", first).c_str()
                                                          : strf("ranks %d-%d", first, first + T - 1).c_str(),
                       range_name(c.model, pl.stages[s]).c_str());
      }
      lines.push_back(strf("  pipeline %zu (%s, %d micro-batches of %d):%s", p, pl.name.c_str(), pl.micro_batches,
                           c.train.micro_batch, stages.c_str()));
    }
  }
  return lines;
}

std::vector<std::string> describe_nodes(const NodeMap& nodes, const std::vector<GroupSpan>& spans) {
  std::vector<std::string> lines;
  std::set<size_t> sizes;
  for (int n = 0; n < nodes.nodes(); n++) sizes.insert(nodes.ranks_on(n).size());
  lines.push_back(strf("nodes: %d%s", nodes.nodes(),
                       sizes.size() == 1 ? strf(" of %zu ranks", *sizes.begin()).c_str() : ""));
  for (int n = 0; n < nodes.nodes(); n++) {
    std::string line = strf("  %s: ranks %s", nodes.label(n).c_str(), ranks_text(nodes.ranks_on(n)).c_str());
    for (const GroupSpan& g : spans) {
      if (!std::binary_search(g.nodes.begin(), g.nodes.end(), n)) continue;
      line += strf("; %s ranks %s", g.name.c_str(), ranks_text(g.ranks).c_str());
      if (g.crosses()) line += strf(" across nodes %s", ranks_text(g.nodes).c_str());
    }
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> describe_crossings(const std::vector<GroupSpan>& spans) {
  std::vector<std::string> lines;
  constexpr size_t kNamed = 8;  // a job of thousands of groups names the first few
  for (const char* kind : {"tensor", "pipeline", "data"}) {
    size_t total = 0;
    std::vector<std::string> crossing;
    for (const GroupSpan& g : spans) {
      if (g.kind != kind) continue;
      total++;
      if (g.crosses())
        crossing.push_back(strf("%s ranks %s on nodes %s", g.name.c_str(), ranks_text(g.ranks).c_str(),
                                ranks_text(g.nodes).c_str()));
    }
    std::string line = strf("%s groups: ", kind);
    if (total == 0) line += "none of more than one rank";
    else if (crossing.empty()) line += strf("%zu, all inside a node", total);
    else {
      line += strf("%zu, %zu crossing a node boundary: ", total, crossing.size());
      for (size_t i = 0; i < std::min(crossing.size(), kNamed); i++) line += (i ? "; " : "") + crossing[i];
      if (crossing.size() > kNamed) line += strf("; and %zu more", crossing.size() - kNamed);
    }
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> tensor_crossing_warnings(const std::vector<GroupSpan>& spans, const NodeMap& nodes,
                                                  int tp_size) {
  std::vector<std::string> out;
  for (const GroupSpan& g : spans) {
    if (g.kind != "tensor" || !g.crosses()) continue;
    std::vector<std::string> labels;
    for (int n : g.nodes) labels.push_back(nodes.label(n));
    out.push_back(strf("tensor group %s (ranks %s) crosses a node boundary: its ranks are on %s, so its all-reduces "
                       "in every layer of every pass go over the network; place whole tensor groups on a node: ranks "
                       "per node a multiple of parallel.tp_size %d, consecutive ranks on one node (mpirun --map-by "
                       "slot, srun --distribution=block)",
                       g.name.c_str(), ranks_text(g.ranks).c_str(), listed(labels).c_str(), tp_size));
  }
  return out;
}

}  // namespace yuan::layout
