#include "util/peak.h"

#include <omp.h>

#include "util/log.h"

namespace yuan {

// 64-byte vectors: one AVX-512 register, or two AVX2 registers when built for an older target.
typedef float vec16 __attribute__((vector_size(64)));

// 12 independent accumulator chains hide the FMA latency (4 cycles) on two FMA ports.
static double fma_block(long iters) {
  vec16 acc[12], mul, add;
  for (int i = 0; i < 16; i++) {
    mul[i] = 0.999999f;
    add[i] = 1e-7f;
  }
  for (auto& a : acc) a = add * static_cast<float>(1 + &a - acc);
  for (long it = 0; it < iters; it++)
    for (auto& a : acc) {
      a = a * mul + add;
      __asm__ volatile("" : "+v"(a));  // keep the chain in a register, unfolded
    }
  float s = 0;
  for (auto& a : acc)
    for (int i = 0; i < 16; i++) s += a[i];
  return s;
}

double measure_peak_flops(double seconds) {
  const long iters = 1 << 16;
  const double flops_per_call = 2.0 * 16 * 12 * iters;
  double best = 0, start = now_seconds(), sink = 0;
  while (now_seconds() - start < seconds) {
    double t0 = now_seconds();
    int threads = 1;
#pragma omp parallel reduction(+ : sink)
    {
      sink += fma_block(iters);
#pragma omp single
      threads = omp_get_num_threads();
    }
    double rate = flops_per_call * threads / (now_seconds() - t0);
    if (rate > best) best = rate;
  }
  return sink == 12345.678 ? 0 : best;
}

}  // namespace yuan
