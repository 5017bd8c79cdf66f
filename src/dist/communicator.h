// Tensor traffic between data-parallel ranks. Buffers are the backend's (host memory for the CPU backend,
// device memory for CUDA), collectives are in place, and all ranks call them in the same order. MPI is the
// control plane (rendezvous, scalars, failure handling: see dist/world.h); an implementation of this interface
// carries the gradients and weights: MpiCommunicator now, NcclCommunicator with the CUDA backend.
//
// Block partitions: reduce_scatter and all_gather take `counts` (one per rank, summing to `count`); rank r's
// block starts at sum(counts[0..r)) inside buf.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "util/dtype.h"

namespace yuan {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce(void* buf, size_t count, DType t, ReduceOp op) = 0;
  // On return this rank's block of buf holds the sum over ranks of that block; other blocks are undefined.
  virtual void reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) = 0;
  // On entry this rank's block holds its data; on return every block holds its owner's data.
  virtual void all_gather(void* buf, const std::vector<size_t>& counts, DType t) = 0;
  virtual void broadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual void barrier() = 0;
};

// Communicator over MPI_COMM_WORLD (host buffers). Counts above INT_MAX are split.
std::unique_ptr<Communicator> make_mpi_communicator();
// The same with every MPI call limited to `max_count_per_call` elements: the tests use a small limit to run
// the splitting paths that only counts above INT_MAX take in production.
std::unique_ptr<Communicator> make_mpi_communicator(size_t max_count_per_call);

}  // namespace yuan
