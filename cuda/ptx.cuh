// The kernels' inline PTX, one instruction per function: the asm for the GPU, and for the emulator (YUAN_EMU) the
// instruction's semantics over the whole warp as the PTX ISA defines them (cuda/emu/warp.cpp states the register
// layouts).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace yuan::gpu {

// d = a b + d on the tensor cores: a 16x16 bf16 tile (row-major fragments), b 16x8 (column-major), fp32 d.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef YUAN_EMU
  const uint32_t b[2] = {b0, b1};
  const float c[4] = {d[0], d[1], d[2], d[3]};
  emu::mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 matrices of 16-bit values from shared memory: lane 8i + j gives the address of row j of matrix i (16
// bytes, 16-byte aligned); r[i] receives this lane's two values of matrix i (row lane/4, columns 2(lane%4) + {0,1}).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef YUAN_EMU
  emu::ldmatrix(r, 4, false, row);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// The same, each matrix transposed: r[i] holds column lane/4 of rows 2(lane%4) + {0,1}.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef YUAN_EMU
  emu::ldmatrix(r, 4, true, row);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

}  // namespace yuan::gpu
