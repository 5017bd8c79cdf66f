#ifdef YUAN_CUDA
#include "comm/nccl.h"

#include "comm/mpi_group.h"
#include "comm/watchdog.h"

namespace yuan::comm {

std::unique_ptr<Communicator> make_group_nccl_communicator(const ProcessGroup& group, DeviceStream producer,
                                                           double timeout_s) {
  NcclId id{};
  if (group.rank() == 0) id = nccl_unique_id();
  {
    Waiting wait("nccl_id_broadcast", group.name().c_str());
    MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group.mpi().comm));
  }
  bound_device_waits(timeout_s, [timeout_s](const char* op, double waited) {
    end_job_for_wait(op, "device", -1, waited, "dist.nccl_timeout_s", timeout_s);
  });
  return make_nccl_communicator(
      group.rank(), group.size(), id, producer, timeout_s, group.name(),
      [group = group.name(), timeout_s](const char* op, double waited) {
        end_job_for_wait(op, group.c_str(), -1, waited, "dist.nccl_timeout_s", timeout_s);
      });
}

}  // namespace yuan::comm
#endif
