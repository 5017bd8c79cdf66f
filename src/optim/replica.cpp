#include "optim/replica.h"

#include "model/gpt.h"
#include "util/error.h"

namespace yuan {

void assemble_replica(Replica& r, const ReplicaSpec& spec, const ReplicaHook& hook) {
  YUAN_CHECK(!r.backend && !r.opts && !r.program, "assemble_replica: the replica is assembled already");
  r.backend = make_backend(spec.device, spec.backend);
  if (spec.weights) {
    // A whole model's weights fit a backend holding whole tensors; a tensor part or a shard is the optimizers' job.
    YUAN_CHECK(spec.layout.tp().size == 1 && !spec.backend.sharded,
               "assemble_replica: weights given to a backend holding a tensor-parallel part or ZeRO-3 shards");
    const ParamLayout whole(spec.layout.config());
    for (const ModuleSpec& mod : spec.layout.modules())
      r.backend->set_params(spec.weights + whole.module(mod.index).offset, mod.offset, mod.numel);
  }
  r.opts = std::make_unique<ZeroOptimizers>();
  Communicator* tensor = hook ? hook(r) : nullptr;
  r.program = std::make_unique<Program>(*r.backend, spec.layout, spec.program, tensor, r.opts->param_source());
}

}  // namespace yuan
