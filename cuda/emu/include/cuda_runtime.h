// cuda_runtime.h of the emulator: the runtime API (cuda_runtime_api.h) and what nvcc provides to device code
// without an include: the function qualifiers, the built-in variables, barriers, warp intrinsics, atomics, the
// cache-hinted loads and the fast math functions. Everything here forwards to the emulator (cuda_emu.h) or is
// plain host C++ with the device function's documented result.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_emu.h"
#include "cuda_runtime_api.h"

// Function and variable qualifiers. A __shared__ variable is one object for all blocks, which the emulator runs
// one at a time and poisons for each; it lives in its own section, 64 KiB apart from the next, so that the checks
// know each array's extent (from the symbol table) and an overrun lands in a gap rather than in a neighbour. The
// 64 KiB alignment is also what marks it: GCC drops a section attribute from the statics of function templates, so
// the build moves every 64 KiB-aligned .bss section into yuan_emu_shared (cuda/emu/gather_shared.sh).
// `extern __shared__` does not compile here ("extern static"): dynamic shared memory is gpu::dynamic_smem<T>()
// (cuda/launch.cuh).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((aligned(65536)))

// The typed overloads of the toolkit's cuda_runtime.h.
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaHostAlloc(T** ptr, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), bytes, flags);
}

#define threadIdx (::yuan::emu::thread_idx())
#define blockIdx (::yuan::emu::block_idx())
// blockDim and gridDim are the running launch's, set when it starts to run (kernel.cpp): objects, as the toolkit
// declares them for host compilation, rather than calls like the two above, because a macro would also rename
// parameters of those names in host headers (the cuDNN frontend's cudaLaunchKernel wrapper has them).
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::yuan::emu::sync_threads(file, line);
}

// ---- warp intrinsics ----

namespace yuan::emu::detail {
template <typename T>
T shuffle(WarpOp op, unsigned mask, T var, int arg, int width, const char* file, int line) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = ::yuan::emu::shuffle(op, mask, bits, arg, width, file, line);
  std::memcpy(&var, &bits, sizeof(T));
  return var;
}
}  // namespace yuan::emu::detail

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return ::yuan::emu::detail::shuffle(::yuan::emu::WarpOp::ShflIdx, mask, var, src_lane, width, file, line);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return ::yuan::emu::detail::shuffle(::yuan::emu::WarpOp::ShflUp, mask, var, static_cast<int>(delta), width, file,
                                      line);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return ::yuan::emu::detail::shuffle(::yuan::emu::WarpOp::ShflDown, mask, var, static_cast<int>(delta), width, file,
                                      line);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return ::yuan::emu::detail::shuffle(::yuan::emu::WarpOp::ShflXor, mask, var, lane_mask, width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return ::yuan::emu::vote(::yuan::emu::WarpOp::Ballot, mask, pred != 0, file, line);
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::yuan::emu::vote(::yuan::emu::WarpOp::All, mask, pred != 0, file, line) == mask;
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::yuan::emu::vote(::yuan::emu::WarpOp::Any, mask, pred != 0, file, line) != 0;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::yuan::emu::sync_warp(mask, file, line);
}

// ---- atomics ----

namespace yuan::emu::detail {
template <typename T>
constexpr AtomicType atomic_type() {
  if constexpr (std::is_same_v<T, int>) return AtomicType::I32;
  else if constexpr (std::is_same_v<T, unsigned>) return AtomicType::U32;
  else if constexpr (std::is_same_v<T, unsigned long long>) return AtomicType::U64;
  else if constexpr (std::is_same_v<T, float>) return AtomicType::F32;
  else {
    static_assert(std::is_same_v<T, double>, "atomics on int, unsigned, unsigned long long, float, double");
    return AtomicType::F64;
  }
}
template <typename T>
T atomic(T* p, AtomicOp op, T v, T compare = T()) {
  uint64_t bits = 0, cmp = 0;
  std::memcpy(&bits, &v, sizeof(T));
  std::memcpy(&cmp, &compare, sizeof(T));
  bits = ::yuan::emu::atomic(p, atomic_type<T>(), op, bits, cmp);
  T old;
  std::memcpy(&old, &bits, sizeof(T));
  return old;
}
}  // namespace yuan::emu::detail

template <typename T>
T atomicAdd(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Add, v); }
template <typename T>
T atomicSub(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Sub, v); }
template <typename T>
T atomicMin(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Min, v); }
template <typename T>
T atomicMax(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Max, v); }
template <typename T>
T atomicExch(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Exch, v); }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
T atomicAnd(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::And, v); }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
T atomicOr(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Or, v); }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
T atomicXor(T* p, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Xor, v); }
template <typename T>
T atomicCAS(T* p, T compare, T v) { return ::yuan::emu::detail::atomic(p, ::yuan::emu::AtomicOp::Cas, v, compare); }

// ---- loads and stores with cache hints: the hint changes caching only, so each is a plain access ----

template <typename T>
T __ldg(const T* p) { return *p; }
template <typename T>
T __ldcs(const T* p) { return *p; }
template <typename T>
T __ldcg(const T* p) { return *p; }
template <typename T>
T __ldlu(const T* p) { return *p; }
template <typename T>
void __stcs(T* p, T v) { *p = v; }
template <typename T>
void __stcg(T* p, T v) { *p = v; }
template <typename T>
void __stwb(T* p, T v) { *p = v; }

// ---- device math: the fast intrinsics compute the exact function (the GPU's approximations are not modelled;
// docs/EMULATOR.md) ----

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

// The device's integer min and max, which are functions of the global namespace in CUDA.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
