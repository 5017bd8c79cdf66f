// The NCCL communicator: tensors between GPUs (cuda/nccl_communicator.cu), MPI staying the control plane. Only in
// builds with the CUDA backend (YUAN_CUDA); plain C++, no NCCL or CUDA header.
#pragma once
#ifdef YUAN_CUDA
#include <array>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace yuan {

using NcclId = std::array<char, 128>;  // the bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
NcclId nccl_unique_id();

// What a communicator calls when a wait ran out its deadline, after aborting: the operation that waited and for how
// long (seconds). It is to end the job; should it return, the communicator throws as without one.
using NcclTimeout = std::function<void(const char* op, double waited)>;

// Rank `rank` of `size` (named `name` in errors) on the current CUDA device. Operations run on the communicator's
// own stream, each after the work enqueued so far on `producer` (the backend's compute stream; null: none).
// Errors and hangs never block the job: every wait polls NCCL's asynchronous error state and a deadline of
// `timeout_s` seconds, and on either it aborts the communicator and throws an Error naming rank and host (main()
// then ends the job with MPI_Abort), or on the deadline calls `on_timeout` where given. Destroying it finalizes
// within the same deadline, or aborts while an exception unwinds.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const NcclId& id, DeviceStream producer,
                                                     double timeout_s, const std::string& name,
                                                     NcclTimeout on_timeout = {});

// The host's waits for the CUDA device's work (the backend's synchronisations: cuda/device.cuh, wait_stream) once
// NCCL operations may stand in its streams, as they do where the backend's compute waits for a gather or a pipeline
// transfer and so for the peers behind it. From the call on each such wait is polled, and one that lasts
// `timeout_s` seconds calls `on_timeout` with the wait's name (should it return, the wait throws an Error), as the
// communicator's own waits do. make_group_nccl_communicator sets it with the job's handler.
void bound_device_waits(double timeout_s, NcclTimeout on_timeout);

namespace comm {
class ProcessGroup;
// The same over a process group (src/comm/nccl.cpp; a name of its own, apart from the one above): the group's rank 0 makes the id and MPI_Bcast brings it
// to the others. Call after cuda_select_device (backend/cuda_backend.h), so each rank talks from its own GPU. A wait
// past the deadline ends the job as an MPI wait past dist.timeout_s does (comm/watchdog.h): one line for the
// job, naming the ranks that do not answer a liveness ping, the operation and the group.
std::unique_ptr<Communicator> make_group_nccl_communicator(const ProcessGroup& group, DeviceStream producer,
                                                           double timeout_s);
}  // namespace comm

}  // namespace yuan
#endif
