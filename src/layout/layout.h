// The job's parallel layout from the [parallel] section (config.h): pipeline templates parsed and checked against
// the model, the pipelines and their micro-batches checked against the global batch and the world, and placed as a
// Topology. Every check runs on every rank before anything is allocated and throws the same collective Error
// there, naming the key and the values; the wording of the heterogeneous-pipeline runner is kept where users know
// it ("Modules in the pipeline template do not match the modules in the model", "The first stage must contain wte
// and wpe", "The last stage must contain ln_f", "Number of ranks in pipeline templates does not match world size",
// "All pipelines must have a corresponding number of micro-batches").
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "layout/schedule.h"
#include "layout/topology.h"
#include "model/gpt.h"

namespace yuan::layout {

struct PipelineTemplate {
  std::string name;
  std::vector<ModuleRange> stages;
};

// "NAME: stage | stage | ..." with stages of modules and ranges (wte, wpe, h.0-h.3, ln_f), or "NAME: auto:K".
PipelineTemplate parse_template(const std::string& text, const GPTConfig& model);

// "wte", "wpe", "h.3", "ln_f" of a module index, and "h.0-h.3"-style text of a range.
std::string module_name(const GPTConfig& c, int module);
std::string range_name(const GPTConfig& c, const ModuleRange& r);

// Modelled training FLOPs per token of each module, forward and backward, counted where they run: 6 x parameters
// for the matmuls of a block plus 12 C T for its attention; the tied classifier's 6 V C with ln_f; the embedding
// lookups nothing. They sum to flops_per_token().
std::vector<double> module_flops(const GPTConfig& c);
// `stages` contiguous ranges tiling [0, cost.size()) that minimise the largest stage cost, cut only at or after
// `first_cut` (the modules before it stay in the first stage).
std::vector<ModuleRange> balance(const std::vector<double>& cost, int stages, int first_cut);

ScheduleKind parse_schedule(const std::string& text);

// The pipelines of `c` on `world` ranks (one one-stage pipeline per rank without [parallel] pipelines), each
// with its micro-batches per step.
Topology make_topology(const Config& c, int world);
// The ranks the [parallel] pipelines take (sum of stages x tp_size); 0 without pipelines.
int layout_ranks(const Config& c);

// Every check of a deck before a run, on every rank: the keys (config.h), train.device, the [parallel] layout
// against the model, the batch and `world` ranks; throws Error naming the offending key. It lives here, not in
// config/, because the device and the layout are known to layers above the deck's.
void validate(const Config& c, int world);

}  // namespace yuan::layout
