#include "util/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace yuan {

namespace {
std::atomic<int> g_blas_threads{0};
}  // namespace

int configure_threads(int ranks_on_node) {
  int threads;
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && std::atoi(env) > 0) {
    threads = std::atoi(env);
  } else {
    cpu_set_t set;
    int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    bool bound = allowed < online;
    threads = bound ? allowed : online / (ranks_on_node > 0 ? ranks_on_node : 1);
    if (threads < 1) threads = 1;
    omp_set_num_threads(threads);
  }
  g_blas_threads.store(threads);  // given to OpenBLAS when src/ops/matmul.cpp loads it, which happens after this
  return threads;
}

int blas_threads() { return g_blas_threads.load(); }

void prepare_blas_environment() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  if (__builtin_cpu_supports("avx512f"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  else if (__builtin_cpu_supports("avx2"))
    setenv("OPENBLAS_CORETYPE", "Haswell", 0);
}

}  // namespace yuan
