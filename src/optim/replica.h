// One replica of the model on a rank: the backend holding its modules, the ZeRO optimizers over them and the
// program, assembled in the one order ZeRO-3 allows (the optimizer, the program's ParamSource, needs the backend;
// the program needs the optimizer). Training, eval and sample, the tests and the benchmarks all build it here.
#pragma once
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "optim/zero.h"
#include "program/program.h"

namespace yuan {

struct ReplicaSpec {
  Device device = Device::Cpu;
  ParamLayout layout;              // the modules held, the tensor part
  BackendSpec backend;             // of the layout, or of ZeRO-3's shards of it (program/params.h backend_spec)
  ProgramSpec program;
  const float* weights = nullptr;  // the whole model's (ParamLayout(layout.config()) order): copied into the held
                                   // modules; null: left to the optimizers (or to the caller)
};

// Members in the order they are made, so that they go in the reverse one: the program, then the optimizers (which
// free their memory through the backend), then the backend.
struct Replica {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ZeroOptimizers> opts;  // none for inference
  std::unique_ptr<Program> program;
};

// Once r.backend exists: adds the replica's optimizers to r.opts (in module order; they load their initial
// weights) and returns the tensor-parallel communicator for the program (null: none). Both may need the backend
// (an NCCL communicator runs on its stream).
using ReplicaHook = std::function<Communicator*(Replica& r)>;

// Fills the empty `r` member by member: the hook finds r.backend made, and a failure part way leaves what was made
// to r's owner, to be torn down in order. The program reads its weights through the optimizers at zero 3
// (ZeroOptimizers::param_source), else from the backend's buffers; r.program->layout() is spec.layout.
void assemble_replica(Replica& r, const ReplicaSpec& spec, const ReplicaHook& hook = {});

}  // namespace yuan
