// fp32 <-> bf16 (cast.cu), rounding to nearest even as src/util/dtype.h does; any offset and length.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace yuan::gpu {

void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t s);
void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t s);

}  // namespace yuan::gpu
