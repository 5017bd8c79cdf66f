// The MPI communicator of a ProcessGroup (comm/groups.h), for the files of comm/ that call MPI over a group: the
// groups' header leaves MPI out, so that including it does not bring <mpi.h> outside comm/.
#pragma once
#include "comm/groups.h"
#include "comm/mpi_check.h"

namespace yuan::comm {

struct ProcessGroup::Mpi {
  MPI_Comm comm = MPI_COMM_NULL;  // freed with it, unless MPI has finalized
  explicit Mpi(MPI_Comm c) : comm(c) {}
  ~Mpi();
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
};

}  // namespace yuan::comm
