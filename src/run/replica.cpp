#include "run/commands.h"

#include "parallel/world.h"
#include "train/memory_plan.h"

namespace yuan {

Replica checkpoint_replica(const CheckpointModel& m, const std::string& device, int micro_batch) {
  const Device d = resolve_device(parse_device(device, "--device"));
  const ProgramSpec spec{{}, micro_batch, 1, false};
  // Every rank of eval or sample builds a replica: the ranks of a node share its host memory (the weights already
  // read are in use, so not counted again). Each rank counts alone on its device, whichever the launcher made
  // visible to it (these commands do not pick one per rank).
  RankMemory need;
  need.device = d;
  need.params = m.weights.size();
  need.on_device = plan_memory(d, m.cfg.model, spec, m.weights.size());
  check_node_memory(need, d == Device::Cuda ? parallel::world().local_rank : -1,
                    micro_batch > 1 ? "a smaller --micro-batch or fewer ranks per node" : "fewer ranks per node");
  Replica r;
  const ParamLayout layout(m.cfg.model);
  assemble_replica(r, {d, layout, backend_spec(layout), spec, m.weights.data()});
  return r;
}

}  // namespace yuan
