// AdamW on the GPU (adamw_kernel.cu): the math of src/ops/adamw.h.
#pragma once
#include <cstddef>

#include "common.cuh"
#include "ops/adamw.h"

namespace yuan::gpu {

// p, m, v, g fp32 in device memory; p_bf16 (may be null) receives bf16(p).
void adamw_update(float* p, float* m, float* v, const float* g, bf16* p_bf16, size_t n, const ops::AdamWHyper& h,
                  cudaStream_t s);

}  // namespace yuan::gpu
