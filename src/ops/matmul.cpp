// Linear layers: out = inp @ w^T + bias, with w stored [OC, C].
// The GEMMs go to OpenBLAS: its sgemm runs at the FMA peak that `make bench` measures (docs/BENCHMARKS.md),
// which no portable kernel of ours would, and the reference backend's speed sets how long the CPU demo and
// the tests take.
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>

#include "ops/ops.h"
#include "util/error.h"

namespace yuan::ops {
namespace {

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                         const float*, blasint, const float*, blasint, float, float*, blasint);

// OpenBLAS chooses its kernels from CPUID when it is loaded. A CPU model it does not know, such as the generic
// "Intel Xeon Processor" that hypervisors report, gets its SSE3 kernels at a third of the speed, so we load it
// ourselves after naming the kernel family the CPU supports (a user's OPENBLAS_CORETYPE wins).
SgemmFn sgemm() {
  static SgemmFn fn = [] {
    if (__builtin_cpu_supports("avx512f"))
      setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
    else if (__builtin_cpu_supports("avx2"))
      setenv("OPENBLAS_CORETYPE", "Haswell", 0);
    void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    YUAN_CHECK(lib, "cannot load OpenBLAS (libopenblas.so.0): %s", dlerror());
    auto f = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
    YUAN_CHECK(f, "libopenblas.so.0 has no cblas_sgemm");
    return f;
  }();
  return fn;
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
      for (int o = 0; o < OC; o++) out[static_cast<size_t>(i) * OC + o] = bias[o];
    beta = 1.0f;
  }
  sgemm()(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC) {
  sgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
  sgemm()(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
  if (!dbias) return;
  constexpr int kBlock = 16;
#pragma omp parallel for schedule(static)
  for (int o0 = 0; o0 < OC; o0 += kBlock) {
    int o1 = o0 + kBlock < OC ? o0 + kBlock : OC;
    for (int i = 0; i < N; i++) {
      const float* d = dout + static_cast<size_t>(i) * OC;
      for (int o = o0; o < o1; o++) dbias[o] += d[o];
    }
  }
}

}  // namespace yuan::ops
