// The layout a job re-forms on the nodes that survive a failure, in the same allocation (jobs/train.sbatch runs it
// through `yuanlm plan --replan`). Pure: the deck's config, the surviving nodes and the ranks on each, and which of
// the job's nodes were lost, in; the new layout as `--section.key=value` overrides, out (or an Error saying what the
// job would need). The rule:
//   - train.global_batch is kept, so training goes on along the same trajectory (the checkpoint re-cuts its shards
//     for any layout); train.micro_batch too where the new layout allows it, else the largest divisor that does;
//   - tensor groups stay inside a node: parallel.tp_size must divide the ranks per node;
//   - data parallelism: as many replicas as the survivors' ranks hold and the global batch divides into; the
//     ranks beyond them are left idle (said);
//   - pipelines (Oobleck's re-instantiation): a pipeline none of whose ranks was on a lost node keeps its template;
//     one that lost a stage is rebuilt from a template with fewer stages (the deck's with the most stages that fit
//     the ranks left over, else auto:K, FLOPs-balanced), or dropped when none fits; the micro-batches of the global
//     batch are then shared over the pipelines in proportion to their modelled throughput (module FLOPs of the
//     slowest stage; the bubble counted), which minimises the modelled step time;
//   - the rule's alternatives (replan_candidates, ranked by the planner's step-time model where a machine file is
//     given: planner/replan.h): each hit pipeline rebuilt from any fewer-stage template the ranks left over hold, or
//     dropped; the sharings of the micro-batches over the pipelines (at least one each) nearest the rule's; and
//     where the deck's micro-batch has no exact sharing, every smaller divisor of the global batch with one;
//   - fewer survivors than the job's minimum (tp_size ranks on a node, a pipeline, the memory `fits` asks for):
//     an Error naming what is needed.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"

namespace yuan::layout {

// Why the job of `c` on `world` ranks does not fit the surviving nodes ("" when it does), e.g. its memory per node.
using FitCheck = std::function<std::string(const Config& c, int world)>;

struct Replan {
  std::vector<std::string> overrides;  // --section.key=value, to apply over the job's own config and overrides
  Config config;                       // the job's config with them applied
  int world = 0;                       // ranks the new job runs, the first `world` of the survivors' ranks
  int idle = 0;                        // survivors' ranks left out
  std::vector<std::string> notes;      // what was kept, rebuilt, dropped or left idle, and why: one line each
};

// `nodes` surviving nodes of `ranks_per_node` ranks each; `lost_nodes`: the indices (0-based, in the order the job's
// ranks filled them, `ranks_per_node` consecutive ranks each) of the job's nodes that are gone, so that the job ran
// on nodes + lost_nodes.size() nodes. With pipelines, the pipelines with a rank on a lost node are the ones
// rebuilt; data parallelism does not care which nodes went. `fits` (optional) is asked about the new layout.
// The FLOPs rule's layout, and the memory `fits` asks for.
Replan replan(const Config& c, int nodes, int ranks_per_node, const std::vector<int>& lost_nodes,
              const FitCheck& fits = {});

// Every layout the rule allows the survivors, each valid for its world: the FLOPs rule's own (replan's) first, then
// the other rebuilds of the hit pipelines and the other sharings of the micro-batches (at most 64 rebuilds, and 64
// sharings nearest the rule's per rebuild and micro-batch size). Throws as replan does when the rule's own is invalid.
std::vector<Replan> replan_candidates(const Config& c, int nodes, int ranks_per_node,
                                      const std::vector<int>& lost_nodes);

}  // namespace yuan::layout
