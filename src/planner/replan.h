// The elastic re-plan ranked by the step-time model: of the layouts layout/elastic's rule allows the survivors of a
// lost node (hit pipelines rebuilt from fewer-stage templates or dropped, the micro-batches shared any way that keeps
// the global batch), the one planner::predict says is fastest on the machine and that fits its memory. layout/
// must not see the planner (tools/folder_graph.py), so the rule lists its candidates and the ranking lives here.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "layout/elastic.h"
#include "planner/machine.h"
#include "planner/step_model.h"

namespace yuan::planner {

struct ReplanChoice {
  layout::Replan replan;    // the layout chosen, its notes ending with why
  Prediction prediction;      // its step on the machine
  Prediction rule;            // the FLOPs rule's own layout's, for comparison
  int considered = 0;         // candidates predicted
  int fitting = 0;            // of them, those that fit the machine's memory
};

// The fastest of layout::replan_candidates(c, nodes, ranks_per_node, lost_nodes) on `m` that fits (ties: the
// earlier, so the FLOPs rule's own where it is as fast). Throws Error when none fits, with what the closest is short
// of; `file` names the machine file in that line.
ReplanChoice best_replan(const Config& c, int nodes, int ranks_per_node, const std::vector<int>& lost_nodes,
                         const Machine& m, const std::string& file);

}  // namespace yuan::planner
