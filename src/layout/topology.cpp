#include "layout/topology.h"

#include <algorithm>

#include "util/error.h"

namespace yuan::layout {

Topology::Topology(std::vector<Pipeline> pipelines, int tp_size, int n_modules)
    : pipelines_(std::move(pipelines)), tp_size_(tp_size), n_modules_(n_modules) {
  YUAN_CHECK(tp_size >= 1, "topology: tensor-parallel size %d must be at least 1", tp_size);
  YUAN_CHECK(!pipelines_.empty(), "topology: no pipelines");
  for (size_t p = 0; p < pipelines_.size(); p++) {
    const Pipeline& pl = pipelines_[p];
    YUAN_CHECK(!pl.stages.empty() && pl.micro_batches >= 1, "topology: pipeline %zu has %zu stages and %d micro-batches",
               p, pl.stages.size(), pl.micro_batches);
    int next = 0;
    for (const ModuleRange& s : pl.stages) {
      YUAN_CHECK(s.first == next && s.end > s.first, "topology: pipeline %zu's stages do not cut modules [0, %d) into "
                 "consecutive non-empty ranges (a stage is [%d, %d))", p, n_modules, s.first, s.end);
      next = s.end;
    }
    YUAN_CHECK(next == n_modules, "topology: pipeline %zu's stages end at module %d of %d", p, next, n_modules);
    first_rank_.push_back(static_cast<int>(places_.size()));
    for (int s = 0; s < static_cast<int>(pl.stages.size()); s++)
      for (int t = 0; t < tp_size; t++) places_.push_back({static_cast<int>(p), s, t});
  }
  // A module group ends where the holders change (every tensor rank holds the same modules: look at rank 0's).
  int first = 0;
  for (int m = 1; m <= n_modules; m++)
    if (m == n_modules || holders(m, 0) != holders(first, 0)) {
      module_groups_.push_back({first, m});
      first = m;
    }
}

Topology Topology::data_parallel(int replicas, int n_modules, int micro_batches, int tp_size) {
  YUAN_CHECK(replicas >= 1, "topology: %d replicas", replicas);
  std::vector<Pipeline> p(static_cast<size_t>(replicas), Pipeline{"", {{0, n_modules}}, micro_batches});
  return Topology(std::move(p), tp_size, n_modules);
}

const Place& Topology::place(int rank) const {
  YUAN_CHECK(rank >= 0 && rank < world_size(), "topology: rank %d outside the %d ranks", rank, world_size());
  return places_[rank];
}

int Topology::rank_of(const Place& p) const {
  YUAN_CHECK(p.pipeline >= 0 && p.pipeline < static_cast<int>(pipelines_.size()) && p.stage >= 0 &&
                 p.stage < static_cast<int>(pipelines_[p.pipeline].stages.size()) && p.tp_rank >= 0 &&
                 p.tp_rank < tp_size_,
             "topology: no rank at pipeline %d, stage %d, tensor rank %d", p.pipeline, p.stage, p.tp_rank);
  return first_rank_[p.pipeline] + p.stage * tp_size_ + p.tp_rank;
}

const ModuleRange& Topology::stage_modules(int rank) const {
  const Place& p = place(rank);
  return pipelines_[p.pipeline].stages[p.stage];
}

int Topology::stages_of(int rank) const { return static_cast<int>(pipelines_[place(rank).pipeline].stages.size()); }

std::vector<int> Topology::pipeline_ranks(int rank) const {
  const Place& p = place(rank);
  std::vector<int> r;
  for (int s = 0; s < stages_of(rank); s++) r.push_back(rank_of({p.pipeline, s, p.tp_rank}));
  return r;
}

std::vector<int> Topology::tensor_ranks(int rank) const {
  const Place& p = place(rank);
  std::vector<int> r;
  for (int t = 0; t < tp_size_; t++) r.push_back(rank_of({p.pipeline, p.stage, t}));
  return r;
}

std::vector<int> Topology::world_ranks() const {
  std::vector<int> r(places_.size());
  for (size_t i = 0; i < r.size(); i++) r[i] = static_cast<int>(i);
  return r;
}

bool Topology::holds(int rank, int module) const {
  const Place& p = place(rank);
  const std::vector<ModuleRange>& stages = pipelines_[p.pipeline].stages;
  return stages[p.stage].contains(module) ||
         (module == 0 && stages.size() > 1 && p.stage + 1 == static_cast<int>(stages.size()));
}

std::vector<int> Topology::holders(int module, int tp_rank) const {
  YUAN_CHECK(module >= 0 && module < n_modules_, "topology: module %d outside the %d modules", module, n_modules_);
  YUAN_CHECK(tp_rank >= 0 && tp_rank < tp_size_, "topology: tensor rank %d of %d", tp_rank, tp_size_);
  std::vector<int> r;
  for (int rank = 0; rank < world_size(); rank++)
    if (places_[rank].tp_rank == tp_rank && holds(rank, module)) r.push_back(rank);
  return r;
}

std::vector<ModuleRange> Topology::module_groups_of(int rank) const {
  std::vector<ModuleRange> r;
  for (const ModuleRange& g : module_groups_)
    if (holds(rank, g.first)) r.push_back(g);
  return r;
}

MicroBatches Topology::micro_batches_of(int rank) const {
  const int pipeline = place(rank).pipeline;
  MicroBatches m{0, pipelines_[pipeline].micro_batches};
  for (int p = 0; p < pipeline; p++) m.first += pipelines_[p].micro_batches;
  return m;
}

bool Topology::replicas_only() const {
  for (const Pipeline& p : pipelines_)
    if (p.stages.size() != 1 || p.micro_batches != pipelines_[0].micro_batches) return false;
  return true;
}

std::string pipeline_group_name(const Place& p) { return strf("pipeline[%d]", p.pipeline); }
std::string tensor_group_name(const Place& p) { return strf("tensor[%d.%d]", p.pipeline, p.stage); }
std::string data_group_name(const ModuleRange& g) {
  return g.size() == 1 ? strf("data[module %d]", g.first) : strf("data[modules %d-%d]", g.first, g.end - 1);
}

}  // namespace yuan::layout
