// Memory of the current CUDA device and page-locked host memory, as the Allocations of backend/backend.h, for the
// backend, its ops and the GPU AdamW (device.cu, beside device selection and the device's peak).
#pragma once
#include <cstddef>

#include "backend/backend.h"
#include "util/memory.h"

namespace yuan::gpu {

// cudaMalloc'ed and zeroed before it returns; not host memory, so not accounted.
Allocation device_allocation(size_t bytes);
// cudaHostAlloc'ed (the device copies it by DMA beside compute), zeroed, accounted under `cat`.
Allocation pinned_allocation(size_t bytes, Mem cat);

}  // namespace yuan::gpu
