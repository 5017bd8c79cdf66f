// `yuanlm plan DECK --machine FILE --nodes N`: the layouts a deck could run in on N nodes of a machine (data x
// tensor x pipeline templates, heterogeneous ones included, x micro-batch x ZeRO stage x the optimizer's placement
// x recompute x schedule), each predicted by the step-time model (planner/step_model.h) and held to the machine's
// memory by plan_rank's figures, ranked by predicted tokens/s. The placement (optim.offload) is none, the fp32
// state on the GPUs, and host, at every ZeRO stage on cuda; host alone on cpu machines.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "planner/machine.h"
#include "planner/step_model.h"

namespace yuan::planner {

// The --section.key=value list that makes `yuanlm train DECK` run the layout of `c` on `m`'s device: the device,
// micro-batch, recompute, ZeRO stage, the optimizer's placement (optim.offload), tensor width, schedule and the
// pipelines (emptied for data parallelism).
std::vector<std::string> layout_overrides(const Config& c, const Machine& m);

struct Candidate {
  Config config;                       // the deck with the layout applied
  int world = 0;
  std::string layout;                  // "tp 1, 8 x 1 stage (16 micro-batches), micro-batch 4, ZeRO 1, optimizer on
                                       // the device" and the like
  std::vector<std::string> overrides;  // layout_overrides
  Prediction prediction;
};

struct Search {
  std::vector<Candidate> fitting;   // fastest first
  std::vector<Candidate> rejected;  // fastest first, as if they fitted
  int refused = 0;                  // layouts the trainer would refuse (validate), and the first one's reason
  std::string refusal;
};
// Every layout of `deck`'s model and global batch on `nodes` x `ranks_per_node` ranks of `m`.
Search search_layouts(const Config& deck, int nodes, int ranks_per_node, const Machine& m);

}  // namespace yuan::planner
