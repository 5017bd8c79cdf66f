#ifdef YUAN_CUDA
#include "dist/nccl.h"

#include "dist/world.h"

namespace yuan {

std::unique_ptr<Communicator> make_nccl_world_communicator(void* producer, double timeout_s) {
  const dist::WorldInfo& w = dist::world();
  NcclId id{};
  if (w.rank == 0) id = nccl_unique_id();
  dist::broadcast_bytes(id.data(), id.size(), 0);
  return make_nccl_communicator(w.rank, w.size, id, producer, timeout_s);
}

}  // namespace yuan
#endif
