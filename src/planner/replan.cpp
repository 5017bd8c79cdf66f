#include "planner/replan.h"

#include "util/error.h"

namespace yuan::planner {

ReplanChoice best_replan(const Config& c, int nodes, int ranks_per_node, const std::vector<int>& lost_nodes,
                         const Machine& m, const std::string& file) {
  const std::vector<layout::Replan> all = layout::replan_candidates(c, nodes, ranks_per_node, lost_nodes);
  ReplanChoice out;
  std::vector<Prediction> predicted;
  int best = -1, closest = 0;
  for (size_t i = 0; i < all.size(); i++) {
    // The job keeps its device; the model needs the machine's to time it.
    Config timed = all[i].config;
    timed.train.device = m.kind;
    predicted.push_back(predict(timed, all[i].world, ranks_per_node, m));
    const Prediction& p = predicted.back();
    if (!p.fits) {
      if (p.over < predicted[closest].over || predicted[closest].fits) closest = static_cast<int>(i);
      continue;
    }
    out.fitting++;
    if (best < 0 || p.step_s < predicted[best].step_s) best = static_cast<int>(i);
  }
  out.considered = static_cast<int>(all.size());
  if (best < 0)
    throw Error(strf("replan: no layout of the %d surviving node%s x %d ranks fits %s (%s): of %d the re-plan rule "
                     "allows, the closest (pipelines %s, micro-batch %d, on %d ranks) is short of %s",
                     nodes, nodes == 1 ? "" : "s", ranks_per_node, m.name.c_str(), file.c_str(), out.considered,
                     all[closest].config.parallel.pipelines.empty() ? "none: data parallelism"
                                                                     : all[closest].config.parallel.pipelines.c_str(),
                     all[closest].config.train.micro_batch, all[closest].world,
                     predicted[closest].short_of.c_str()), true);
  out.replan = all[best];
  out.prediction = predicted[best];
  out.rule = predicted.front();
  out.replan.notes.push_back(
      best == 0 ? strf("chosen by the step-time model on %s: predicted step %.4g s, %.4g tokens/s, the fastest of %d "
                       "layouts that fit (of %d the rule allows); the FLOPs rule's own", m.name.c_str(),
                       out.prediction.step_s, out.prediction.tokens_per_s, out.fitting, out.considered)
                : strf("chosen by the step-time model on %s: predicted step %.4g s, %.4g tokens/s, the fastest of %d "
                       "layouts that fit (of %d the rule allows); the FLOPs rule's own would take %.4g s%s",
                       m.name.c_str(), out.prediction.step_s, out.prediction.tokens_per_s, out.fitting,
                       out.considered, out.rule.step_s, out.rule.fits ? "" : strf(" and does not fit: %s",
                       out.rule.short_of.c_str()).c_str()));
  return out;
}

}  // namespace yuan::planner
