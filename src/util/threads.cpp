#include "util/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace yuan {

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
  // Read by OpenBLAS when src/ops/matmul.cpp loads it, which happens after this.
  setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 0);
  return threads;
}

}  // namespace yuan
