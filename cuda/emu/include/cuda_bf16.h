// bfloat16 for the emulator, with the conversions of the toolkit's cuda_bf16.h: float -> bf16 rounds to nearest
// even (cvt.rn.bf16.f32), a NaN becomes the canonical 0x7fff, overflow becomes infinity; bf16 -> float is exact.
// Arithmetic operators on bf16 are not provided: nothing here uses them, and a use fails to compile rather than
// running with other rounding than the GPU's.
#pragma once
#include <cstdint>
#include <cstring>

#include "vector_types.h"

namespace yuan::emu {
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 dropped bits
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace yuan::emu

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::yuan::emu::float_to_bf16_bits(f)) {}
  operator __nv_bfloat16_raw() const { return {__x}; }
  operator float() const { return ::yuan::emu::bf16_bits_to_float(__x); }
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

// The toolkit's host-side names for the types.
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16_raw{::yuan::emu::float_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return ::yuan::emu::bf16_bits_to_float(h.__x); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return {__float2bfloat16(lo), __float2bfloat16(hi)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) { return {lo, hi}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
inline float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
