// half precision for the emulator, with the conversions of the toolkit's cuda_fp16.h: float -> half rounds to
// nearest even (cvt.rn.f16.f32) through the subnormals, values from 65520 up become infinity, a NaN becomes the
// canonical 0x7fff; half -> float is exact (a NaN becomes 0x7fffffff). No arithmetic operators (see cuda_bf16.h).
#pragma once
#include <cstdint>
#include <cstring>

#include "vector_types.h"

namespace yuan::emu {
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up round to infinity
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent (127 -> 15), round the 13 dropped bits
    uint32_t m = a - 0x38000000u;
    m += 0xfffu + ((m >> 13) & 1u);
    return static_cast<uint16_t>(sign | (m >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below 2^-25: zero
  // A subnormal half: q * 2^-24 with q = significand >> (126 - exponent), rounded half to even; q = 1024 carries
  // into the smallest normal, which is the right bit pattern.
  const uint32_t e = a >> 23, shift = 126 - e, mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | q);
}
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1f) {
    u = m ? 0x7fffffffu : (sign | 0x7f800000u);
  } else if (e != 0) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else {  // zero or subnormal: exact in float
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    std::memcpy(&u, &v, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace yuan::emu

struct __half_raw {
  unsigned short x;
};

struct alignas(2) __half {
  unsigned short __x;
  __half() = default;
  __half(const __half_raw& r) : __x(r.x) {}
  __half(float f) : __x(::yuan::emu::float_to_half_bits(f)) {}
  operator __half_raw() const { return {__x}; }
  operator float() const { return ::yuan::emu::half_bits_to_float(__x); }
};

struct alignas(4) __half2 {
  __half x, y;
};

// The toolkit's host-side names for the types.
typedef __half half;
typedef __half2 half2;

inline __half __float2half(float f) { return __half_raw{::yuan::emu::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) { return ::yuan::emu::half_bits_to_float(h.__x); }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half(lo), __float2half(hi)}; }
inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
