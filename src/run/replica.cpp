#include "run/commands.h"

namespace yuan {

Replica checkpoint_replica(const CheckpointModel& m, const std::string& device, int micro_batch) {
  const Device d = resolve_device(parse_device(device, "--device"));
  const ProgramSpec spec{{}, micro_batch, 1, false};
  check_memory(d, m.cfg.model, spec, m.weights.size(), device_free_bytes(d));
  Replica r;
  r.backend = make_backend(d, {m.cfg.model, {}});
  r.backend->set_params(m.weights.data(), 0, m.weights.size());
  r.program = std::make_unique<Program>(*r.backend, spec);
  return r;
}

}  // namespace yuan
