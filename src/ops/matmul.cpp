// Linear layers: out = inp @ w^T + bias, with w stored [OC, C].
// The GEMMs go to OpenBLAS rather than a blocked kernel of ours: its AVX-512 sgemm reaches about 0.8 of the
// FMA peak that `make bench` measures on gpt-small's shapes (docs/BENCHMARKS.md), and the reference backend's
// speed sets how long the CPU demo and the tests take.
#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "ops/reference_ops.h"
#include "util/error.h"
#include "util/threads.h"

// Debian's directory for this architecture's libraries, where its OpenBLAS variants live.
#if defined(__x86_64__)
#define YUAN_MULTIARCH "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define YUAN_MULTIARCH "aarch64-linux-gnu"
#else
#define YUAN_MULTIARCH ""
#endif

namespace yuan::ops {
namespace {

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                         const float*, blasint, const float*, blasint, float, float*, blasint);

// OpenBLAS chooses its kernels from CPUID when it is loaded. A CPU model it does not know, such as the generic
// "Intel Xeon Processor" that hypervisors report, gets its SSE3 kernels at a third of the speed, so we load it
// ourselves after naming the kernel family the CPU supports (a user's OPENBLAS_CORETYPE wins).
// We also prefer OpenBLAS's OpenMP build: the pthread build's own spinning threads fight the OpenMP threads of
// every other op, which halved the tiny model's step rate on 2 cores (docs/BENCHMARKS.md).
// The thread count (util/threads.h) goes to it through openblas_set_num_threads once it is loaded, unless the user's
// OPENBLAS_NUM_THREADS said otherwise: setting the variable here, with other threads running, could crash them.
SgemmFn sgemm() {
  static SgemmFn fn = [] {
    prepare_blas_environment();  // set at the start of main already (before any thread); else now
    const char* explicit_path = std::getenv("YUAN_OPENBLAS");
    const char* candidates[] = {
        explicit_path,                                                 // the user's choice
        "/usr/lib/" YUAN_MULTIARCH "/openblas-openmp/libopenblas.so.0",  // Debian, Ubuntu
        "libopenblaso.so.0",                                           // Fedora, RHEL
        "libopenblas.so.0",                                            // whatever the loader finds
    };
    void* lib = nullptr;
    std::string tried;
    for (const char* c : candidates) {
      if (!c) continue;
      if ((lib = dlopen(c, RTLD_NOW | RTLD_LOCAL))) break;
      tried += std::string(tried.empty() ? "" : "; ") + dlerror();
    }
    YUAN_CHECK(lib, "cannot load OpenBLAS (set YUAN_OPENBLAS to its libopenblas.so): %s", tried.c_str());
    auto f = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
    YUAN_CHECK(f, "the OpenBLAS library loaded has no cblas_sgemm");
    using SetThreadsFn = void (*)(int);
    const auto set_threads = reinterpret_cast<SetThreadsFn>(dlsym(lib, "openblas_set_num_threads"));
    if (set_threads && blas_threads() > 0 && !std::getenv("OPENBLAS_NUM_THREADS")) set_threads(blas_threads());
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
