#include "util/peak.h"

#include <algorithm>

#include "util/log.h"

namespace yuan {

// One register of floats at the widest vectors the build targets: the asm below pins every chain to a single
// register, which a vector wider than the target's registers cannot satisfy (it does not compile).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));

// 12 independent accumulator chains hide the FMA latency (4 cycles) on two FMA ports. They are named
// variables, not an array, so that they stay in registers: an array lives on the stack, and a store and load
// in every chain halves the rate.
static double fma_block(long iters) {
  vec mul, add;
  for (int i = 0; i < kLanes; i++) {
    mul[i] = 0.999999f;
    add[i] = 1e-7f;
  }
  vec a0 = add, a1 = a0 + add, a2 = a1 + add, a3 = a2 + add, a4 = a3 + add, a5 = a4 + add;
  vec a6 = a5 + add, a7 = a6 + add, a8 = a7 + add, a9 = a8 + add, a10 = a9 + add, a11 = a10 + add;
  for (long it = 0; it < iters; it++) {
    a0 = a0 * mul + add, a1 = a1 * mul + add, a2 = a2 * mul + add, a3 = a3 * mul + add;
    a4 = a4 * mul + add, a5 = a5 * mul + add, a6 = a6 * mul + add, a7 = a7 * mul + add;
    a8 = a8 * mul + add, a9 = a9 * mul + add, a10 = a10 * mul + add, a11 = a11 * mul + add;
    // keeps the compiler from folding the chains, without moving them out of registers
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),
                     "+v"(a9), "+v"(a10), "+v"(a11));
  }
  vec sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  float s = 0;
  for (int i = 0; i < kLanes; i++) s += sum[i];
  return s;
}

// Each thread times short blocks of its own and keeps its fastest; the peak is the sum of those. A block is about
// 0.1 ms, so on a loaded node (other jobs, ranks sharing cores) each thread still finds blocks the scheduler left
// whole, where timing the threads together would charge every block with the slowest thread's preemptions: that
// read a peak too low, and an MFU over 100%, on a loaded node.
double measure_peak_flops(double seconds) {
  const long iters = 1 << 13;
  const double flops_per_block = 2.0 * kLanes * 12 * iters;
  double peak = 0, sink = 0;
#pragma omp parallel reduction(+ : peak, sink)
  {
    double best = 0;
    const double start = now_seconds();
    while (now_seconds() - start < seconds) {
      const double t0 = now_seconds();
      sink += fma_block(iters);
      best = std::max(best, flops_per_block / (now_seconds() - t0));
    }
    peak += best;
  }
  return sink == 12345.678 ? 0 : peak;
}

}  // namespace yuan
