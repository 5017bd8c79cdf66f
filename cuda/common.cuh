// Device helpers shared by the kernels in cuda/: 16-byte vector access, warp and block reductions, launch sizes.
//
// The kernels come one family per file (cuda/<family>.cu, declared in <family>.cuh), each the twin of
// src/ops/<family>.cpp, whose header (src/ops/reference_ops.h) states the math and the conventions: N = B*T rows, C
// channels, OC output channels, weights [out, in], row-major. Differences from the CPU ops, all for speed:
//   - weights and activations are bf16 (every sum in fp32); parameter gradients are fp32 and, as on the CPU,
//     ADDED into; activation gradients are written, not added, unless a function says otherwise;
//   - every launcher takes the stream it runs on and returns without waiting, unless it returns a value;
//   - C % 8 == 0 and 16-byte aligned tensors (one 16-byte vector = 8 bf16 is the unit of every access).
// Kernels start through launch() and find their dynamic shared memory through dynamic_smem() (launch.cuh), their
// inline PTX is in ptx.cuh: the same sources build for the GPU and for the emulator (cuda/emu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cuda_check.h"
#include "launch.cuh"

namespace yuan::gpu {

using bf16 = __nv_bfloat16;
constexpr int kWarpSize = 32;

// 16 bytes of T: the unit of every vector load and store, so that a warp moves 512 contiguous bytes per
// instruction. Callers guarantee 16-byte alignment (every tensor offset is a multiple of C, and C % 8 == 0).
// Half packs (8 bytes) serve a loop that moves bf16 and fp32 data by the same channels: 4 channels a lane are 8
// bytes of bf16 and 16 of fp32, and both make contiguous warp-wide requests.
template <typename T, int Bytes = 16>
struct alignas(Bytes) Pack {
  static constexpr int kN = Bytes / sizeof(T);
  T v[kN];
};
using PackBf16 = Pack<bf16>;  // 8 values
using PackF32 = Pack<float>;  // 4 values
using HalfPackBf16 = Pack<bf16, 8>;  // 4 values

// In the emulator build (cuda/emu) a pack access is one access of the emulator, emu::load_vector/store_vector, as
// it is one instruction on the GPU (ld.global.v4, .v2): a copy of the struct would reach the emulator as element
// accesses at code addresses of their own, which its request model (docs/EMULATOR.md, "Traffic") would count as
// that many requests. Binding the reference keeps -fsanitize=alignment's check of the pack's type. The helpers are
// always inlined, as nvcc's __forceinline__ does and the emulator's does not promise, and never end in a tail call:
// the emulator takes the access site from the return address, which must lie in the code that asked.
#ifdef YUAN_EMU
#define YUAN_PACK_INLINE __attribute__((always_inline))
#else
#define YUAN_PACK_INLINE
#endif

template <int Bytes = 16, typename T>
__device__ __forceinline__ YUAN_PACK_INLINE Pack<T, Bytes> load_pack(const T* p) {
#ifdef YUAN_EMU
  const Pack<T, Bytes>& at = *reinterpret_cast<const Pack<T, Bytes>*>(p);
  Pack<T, Bytes> x;
  emu::load_vector(&x, &at, Bytes);
  asm volatile("");
  return x;
#else
  return *reinterpret_cast<const Pack<T, Bytes>*>(p);
#endif
}
template <typename T, int Bytes>
__device__ __forceinline__ YUAN_PACK_INLINE void store_pack(T* p, const Pack<T, Bytes>& x) {
#ifdef YUAN_EMU
  Pack<T, Bytes>& at = *reinterpret_cast<Pack<T, Bytes>*>(p);
  emu::store_vector(&at, &x, Bytes);
  asm volatile("");
#else
  *reinterpret_cast<Pack<T, Bytes>*>(p) = x;
#endif
}
// Streaming ("cache evict first") variants, for data read or written once per pass (the logits), so that it does
// not push the weights and activations out of L2. The emulator has no cache: they are the plain accesses there.
template <typename T>
__device__ __forceinline__ YUAN_PACK_INLINE Pack<T> load_pack_cs(const T* p) {
#ifdef YUAN_EMU
  return load_pack(p);
#else
  int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
  Pack<T> x;
  memcpy(&x, &raw, 16);
  return x;
#endif
}
template <typename T>
__device__ __forceinline__ YUAN_PACK_INLINE void store_pack_cs(T* p, const Pack<T>& x) {
#ifdef YUAN_EMU
  store_pack(p, x);
#else
  int4 raw;
  memcpy(&raw, &x, 16);
  __stcs(reinterpret_cast<int4*>(p), raw);
#endif
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block, returned to every thread. `scratch` holds one T per warp; the trailing barrier makes
// the call safe to repeat with the same scratch.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, n_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < n_warps; w++) total += scratch[w];  // same order in every thread: one result for all
  __syncthreads();
  return total;
}

inline unsigned ceil_div(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Blocks for a grid-stride loop over n items: enough to fill the GPU a few times over, no more.
inline unsigned grid_for(size_t n, int threads) {
  static const int sms = [] {
    int dev = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  size_t want = (n + threads - 1) / threads, most = static_cast<size_t>(sms) * 8;
  return static_cast<unsigned>(want < 1 ? 1 : want < most ? want : most);
}

// Above 48 KiB of dynamic shared memory a kernel must opt in, once per kernel (callers hold a function-local
// static: `static const bool init = (allow_smem(k, bytes), true);`).
template <typename Kernel>
void allow_smem(Kernel k, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace yuan::gpu
