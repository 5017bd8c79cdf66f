// Elementwise passes over flat vectors (cast.cu): fp32 <-> bf16, rounding to nearest even as src/util/dtype.h
// does, and the fp32 add; any offset and length.
#pragma once
#include <cstddef>

#include "common.cuh"

namespace yuan::gpu {

void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t s);
void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t s);
// dst[i] += src[i] (CPU twin: ops::add): one rounding per element, the same bits as the CPU's.
void add_f32(float* dst, const float* src, size_t n, cudaStream_t s);

}  // namespace yuan::gpu
