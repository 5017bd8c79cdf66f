// Memory of the current CUDA device and page-locked host memory, as the Allocations of backend/backend.h, for the
// backend, its ops and the GPU AdamW (device.cu, beside device selection and the device's peak).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/backend.h"
#include "cuda_check.h"
#include "util/memory.h"

namespace yuan::gpu {

// cudaMalloc'ed and zeroed before it returns; not host memory, so not accounted.
Allocation device_allocation(size_t bytes);
// cudaHostAlloc'ed (the device copies it by DMA beside compute), zeroed, accounted under `cat`.
Allocation pinned_allocation(size_t bytes, Mem cat);

// The host waiting for the device's work on a stream, or up to an event; `what` names what is waited for in an
// error. A plain synchronisation until NCCL operations may stand in the device's streams (the backend's compute
// waits for gathers and pipeline transfers, so for the peers behind them): from then on the wait is polled, and
// one past the bound of yuan::bound_device_waits (comm/nccl.h) ends as a communicator's own wait past its
// deadline does, instead of blocking the host for good. Inline, so that a plain synchronisation is its caller's own
// call: the emulator's account of the calls that wait for the device names them by caller (test_roofline.cu).
bool device_waits_bounded();
void wait_stream_bounded(cudaStream_t s, const char* what);
void wait_event_bounded(cudaEvent_t e, const char* what);

[[gnu::always_inline]] inline void wait_stream(cudaStream_t s, const char* what) {
  if (device_waits_bounded()) return wait_stream_bounded(s, what);
  CUDA_CHECK(cudaStreamSynchronize(s));
}

[[gnu::always_inline]] inline void wait_event(cudaEvent_t e, const char* what) {
  if (device_waits_bounded()) return wait_event_bounded(e, what);
  CUDA_CHECK(cudaEventSynchronize(e));
}

}  // namespace yuan::gpu
