// Where every rank sits in a job's parallel layout, and who it talks to: pure arithmetic over the layout, no MPI
// (comm/groups.h turns the groups into MPI communicators).
//
// A job runs pipelines side by side. Each pipeline cuts the model's modules (wte, wpe, h.0 .. h.N-1, ln_f) into
// stages, each a contiguous ModuleRange; pipelines may cut differently and have different depths (heterogeneous
// templates). Every stage is `tp_size` ranks wide (tensor parallelism). Ranks are numbered pipeline by pipeline,
// stage by stage, tensor rank innermost, so a stage's tensor-parallel ranks are neighbours (usually one node):
//   world = sum over pipelines of stages x tp_size.
// Pure data parallelism is `world` pipelines of one stage.
//
// The groups a rank belongs to:
//   pipeline  the ranks of its pipeline with its tensor rank, in stage order (activations pass along it);
//   tensor    the ranks of its stage (tensor-parallel collectives);
//   data      for a module, every rank holding its parameters with the same tensor rank: the ranks whose
//             gradients of it are summed and over which its optimizer state is sharded. The last stage of a
//             pipeline holds a copy of wte for the tied classifier besides its own modules, so wte's holders are
//             the first and the last stages. However the pipelines cut the model, consecutive modules with the same
//             holders form one module group, and a rank holds whole module groups;
//   world     everyone.
#pragma once
#include <string>
#include <vector>

#include "model/gpt.h"

namespace yuan::layout {

struct Pipeline {
  std::string name;                  // the template it was made from ("" for data parallelism)
  std::vector<ModuleRange> stages;   // in order, tiling [0, n_modules)
  int micro_batches = 1;             // per optimizer step
};

struct Place {
  int pipeline = 0, stage = 0, tp_rank = 0;
};

// Micro-batches [first, first + count) of a step, counted over every pipeline.
struct MicroBatches {
  int first = 0, count = 0;
};

class Topology {
 public:
  // Throws Error when a pipeline's stages do not tile [0, n_modules) in order, or tp_size < 1.
  Topology(std::vector<Pipeline> pipelines, int tp_size, int n_modules);
  // `replicas` pipelines of one stage holding every module, each `tp_size` ranks wide and running `micro_batches`
  // per step.
  static Topology data_parallel(int replicas, int n_modules, int micro_batches, int tp_size = 1);

  int world_size() const { return static_cast<int>(places_.size()); }
  int tp_size() const { return tp_size_; }
  int n_modules() const { return n_modules_; }
  const std::vector<Pipeline>& pipelines() const { return pipelines_; }
  const Place& place(int rank) const;
  int rank_of(const Place& p) const;
  const ModuleRange& stage_modules(int rank) const;
  int stages_of(int rank) const;  // depth of the rank's pipeline

  std::vector<int> pipeline_ranks(int rank) const;
  std::vector<int> tensor_ranks(int rank) const;
  std::vector<int> world_ranks() const;
  // Whether `rank` holds the parameters of `module`: its stage runs it, or it is wte and the stage is the last of
  // a pipeline of several (model/gpt.h held_modules).
  bool holds(int rank, int module) const;
  // Ranks holding `module` with tensor rank `tp_rank`, increasing.
  std::vector<int> holders(int module, int tp_rank) const;
  // Every pipeline is one stage running the same micro-batches: the members of a data group run the same passes
  // without waiting on other ranks, so their collectives may go during backward (optim/zero.h `overlap`).
  bool replicas_only() const;
  // The module groups in module order; they tile [0, n_modules).
  const std::vector<ModuleRange>& module_groups() const { return module_groups_; }
  // The module groups the rank holds, in module order.
  std::vector<ModuleRange> module_groups_of(int rank) const;
  // Which micro-batches of each step's global batch `rank`'s pipeline runs (the loaders of both of its ends read
  // them): the pipelines take consecutive runs of micro-batches, in pipeline order.
  MicroBatches micro_batches_of(int rank) const;

 private:
  std::vector<Pipeline> pipelines_;
  int tp_size_, n_modules_;
  std::vector<Place> places_;        // by rank
  std::vector<int> first_rank_;      // by pipeline
  std::vector<ModuleRange> module_groups_;
};

// The names groups go by in messages (ProcessGroups, the watchdog, layout/nodes.h): "pipeline[P]",
// "tensor[P.S]", and "data[module M]" or "data[modules A-B]" for a module group's data groups.
std::string pipeline_group_name(const Place& p);
std::string tensor_group_name(const Place& p);
std::string data_group_name(const ModuleRange& modules);

}  // namespace yuan::layout
