// MPI_CHECK(call): MPI_COMM_WORLD is set to MPI_ERRORS_RETURN by comm::init, so a failed call comes back as a
// code; this turns it into a yuan::Error naming the call site, the rank and MPI's own explanation.
#pragma once
// The deprecated MPI C++ bindings are unused and trip -Wcast-function-type.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "util/error.h"

namespace yuan::comm {

[[noreturn]] inline void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) len = std::snprintf(msg, sizeof msg, "MPI error %d", code);
  throw Error(strf("%s:%d: %s failed on rank %d@%s: %.*s", file, line, call, process_rank(), process_host().c_str(),
                   len, msg));
}

}  // namespace yuan::comm

#define MPI_CHECK(call)                                                                       \
  do {                                                                                        \
    int yuan_mpi_rc_ = (call);                                                                \
    if (yuan_mpi_rc_ != MPI_SUCCESS) ::yuan::comm::throw_mpi_error(yuan_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
