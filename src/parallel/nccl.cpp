#ifdef YUAN_CUDA
#include "parallel/nccl.h"

#include "parallel/groups.h"

namespace yuan::parallel {

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroup& group, DeviceStream producer,
                                                     double timeout_s) {
  NcclId id{};
  if (group.rank() == 0) id = nccl_unique_id();
  MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group.comm()));
  return yuan::make_nccl_communicator(group.rank(), group.size(), id, producer, timeout_s, group.name());
}

}  // namespace yuan::parallel
#endif
