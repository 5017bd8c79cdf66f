#ifdef YUAN_CUDA
#include "parallel/nccl.h"

#include "parallel/world.h"

namespace yuan {

std::unique_ptr<Communicator> make_nccl_world_communicator(void* producer, double timeout_s) {
  const parallel::WorldInfo& w = parallel::world();
  NcclId id{};
  if (w.rank == 0) id = nccl_unique_id();
  parallel::broadcast_bytes(id.data(), id.size(), 0);
  return make_nccl_communicator(w.rank, w.size, id, producer, timeout_s);
}

}  // namespace yuan
#endif
