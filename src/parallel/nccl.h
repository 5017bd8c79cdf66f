// The NCCL communicator: gradients and weights between GPUs (cuda/nccl_communicator.cu), MPI staying the
// control plane. Only in builds with the CUDA backend (YUAN_CUDA); plain C++, no NCCL or CUDA header.
#pragma once
#ifdef YUAN_CUDA
#include <array>
#include <memory>

#include "parallel/communicator.h"

namespace yuan {

using NcclId = std::array<char, 128>;  // the bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
NcclId nccl_unique_id();

// Rank `rank` of `size` on the current CUDA device. Collectives run on the communicator's own stream, each after
// the work enqueued so far on `producer` (the backend's compute stream, a cudaStream_t; nullptr: none). Errors and
// hangs never block the job: every wait polls NCCL's asynchronous error state and a deadline of `timeout_s`
// seconds, and on either it aborts the communicator and throws an Error naming rank and host (main() then ends
// the job with MPI_Abort). Destroying it finalizes within the same deadline, or aborts while an exception unwinds.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const NcclId& id, void* producer,
                                                     double timeout_s);
// The same over MPI_COMM_WORLD (src/parallel/nccl.cpp): rank 0's id reaches every rank by MPI_Bcast. Call after
// cuda_select_device (backend/cuda_backend.h), so each rank talks from its own GPU.
std::unique_ptr<Communicator> make_nccl_world_communicator(void* producer, double timeout_s);

}  // namespace yuan
#endif
