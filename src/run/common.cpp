#include "run/commands.h"

namespace yuan {

std::unique_ptr<Backend> checkpoint_backend(const CheckpointModel& m, const std::string& device, int micro_batch) {
  std::unique_ptr<Backend> b = make_backend(device, m.cfg.model, micro_batch, m.weights.size());
  b->set_params(m.weights.data(), 0, m.weights.size());
  return b;
}

}  // namespace yuan
