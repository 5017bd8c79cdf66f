#include "run/commands.h"

#include "comm/world.h"
#include "layout/topology.h"
#include "train/memory_plan.h"

namespace yuan {

Replica checkpoint_replica(const CheckpointModel& m, const std::string& device, int micro_batch) {
  const Device d = resolve_device(parse_device(device, "--device"));
  // The set-up of a job of one rank holding the whole model, as train and plan derive a rank's (plan_rank): whatever
  // layout the checkpoint's run had, these commands run each rank on every module, one micro-batch at a time.
  Config c = m.cfg;
  c.parallel = ParallelConfig{};
  c.optim.zero = ZeroStage(0);
  c.train.micro_batch = micro_batch;
  c.train.recompute = false;
  const RankPlan plan = plan_rank(c, layout::Topology::data_parallel(1, module_count(c.model), 1), d, 0);
  // Every rank of eval or sample builds a replica: the ranks of a node share its host memory (the weights already
  // read are in use, so not counted again). Each rank counts alone on its device, whichever the launcher made
  // visible to it (these commands do not pick one per rank). There is no optimizer and no training loader: only
  // the backend's and the program's memory count.
  RankMemory need;
  need.device = plan.memory.device;
  need.params = plan.memory.params;
  need.on_device = plan.memory.on_device;
  check_node_memory(need, d == Device::Cuda ? comm::world().local_rank : -1,
                    micro_batch > 1 ? "a smaller --micro-batch or fewer ranks per node" : "fewer ranks per node");
  Replica r;
  assemble_replica(r, {d, plan.layout, plan.backend, plan.program, m.weights.data()});
  return r;
}

}  // namespace yuan
