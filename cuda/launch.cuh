// What differs between the GPU build (nvcc) and the emulator build (g++ against cuda/emu, docs/EMULATOR.md) in
// how kernels start and find their dynamic shared memory; every kernel file uses these instead of the syntax.
//   launch(kernel, grid, block, shared_bytes, stream, args...)   kernel<<<grid, block, shared_bytes, stream>>>(args...)
//                                                                 and its launch check
//   dynamic_smem<T>()                                              extern __shared__ memory, as T*
// In the emulator the arguments, converted to the kernel's parameter types at the launch as CUDA does, become the
// kernel's parameter memory, and the emulator runs the grid's threads.
// launch() is the one place kernels start, so it is where the kernel account (kernel_account.cuh) times them: when
// an account is active, events around the launch and, in the emulator, the launch's memory traffic.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_check.h"
#include "kernel_account.cuh"

namespace yuan::gpu {

#ifdef YUAN_EMU
namespace detail {
template <typename... P>
struct KernelCall {
  void (*kernel)(P...);
  std::tuple<std::decay_t<P>...> args;
  static void run(const void* self) {  // one thread's body
    const KernelCall& c = *static_cast<const KernelCall*>(self);
    std::apply(c.kernel, c.args);
  }
};
}  // namespace detail
#endif

template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: the kernel takes another number of arguments");
  Account* account = active_account();
  LaunchRecord* rec = account ? account->begin(reinterpret_cast<const void*>(kernel), nullptr, stream) : nullptr;
#ifdef YUAN_EMU
  using Call = detail::KernelCall<P...>;
  auto call = std::make_shared<const Call>(Call{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
  emu::launch({reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream,
               rec ? &rec->traffic : nullptr},
              call, sizeof(Call), &Call::run);
#else
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<A>(args)...);
#endif
  CUDA_CHECK(cudaGetLastError());
  if (rec) account->end(rec, stream);
}

template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
#ifdef YUAN_EMU
  return reinterpret_cast<T*>(emu::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char smem[];
  return reinterpret_cast<T*>(smem);
#endif
}

}  // namespace yuan::gpu
