// The thread settings change no environment variable once threads may run (util/threads.h): setenv beside
// another thread's getenv can crash it, and MPI's threads call getenv. configure_threads runs after MPI_Init.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "comm/world.h"
#include "util/threads.h"

namespace yuan {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string("=") + v : "(unset)";
}

TEST(Threads, NoEnvironmentChangeAfterStartUp) {
  char** const before = environ;
  const std::string blas = env("OPENBLAS_NUM_THREADS"), core = env("OPENBLAS_CORETYPE");
  const int threads = configure_threads(comm::world().local_size);  // what main did after MPI_Init
  prepare_blas_environment();  // main's call came first: this one changes nothing
  EXPECT_EQ(environ, before);
  EXPECT_EQ(env("OPENBLAS_NUM_THREADS"), blas);  // OpenBLAS gets the count when it is loaded instead
  EXPECT_EQ(env("OPENBLAS_CORETYPE"), core);
  EXPECT_GE(threads, 1);
  EXPECT_EQ(blas_threads(), threads);
}

}  // namespace
}  // namespace yuan
