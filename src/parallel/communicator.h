// Tensor traffic between data-parallel ranks. Buffers are the backend's (host memory for the CPU backend,
// device memory for CUDA), collectives are in place, and all ranks call them in the same order. MPI is the
// control plane (rendezvous, scalars, failure handling: see parallel/world.h); an implementation of this interface
// carries the gradients and weights: MpiCommunicator for host buffers, NcclCommunicator (parallel/nccl.h) for GPU
// memory, LocalCommunicator for one process without MPI.
//
// Block partitions: reduce_scatter and all_gather take `counts` (one per rank, summing to `count`); rank r's
// block starts at sum(counts[0..r)) inside buf.
//
// Completion: host communicators finish every call before returning (stream() is null). A device communicator
// enqueues each collective on its stream() after the work the backend has enqueued so far, and returns at once;
// synchronize() waits for all of them, and is where a failed or hung peer surfaces as an Error.
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
  // Sum over ranks of a host scalar (the squared gradient norm); returns after every earlier collective.
  virtual double sum(double x) = 0;
  // cudaStream_t the collectives run on, or nullptr when each call completes before returning.
  virtual void* stream() { return nullptr; }
  virtual void synchronize() {}
};

// Communicator over MPI_COMM_WORLD (host buffers). Counts above INT_MAX are split.
// Start of every rank's block, plus the total at the end; throws unless there is one count per rank.
std::vector<size_t> block_offsets(const std::vector<size_t>& counts, int ranks, const char* what);

std::unique_ptr<Communicator> make_mpi_communicator();
// The same with every MPI call limited to `max_count_per_call` elements: the tests use a small limit to run
// the splitting paths that only counts above INT_MAX take in production.
std::unique_ptr<Communicator> make_mpi_communicator(size_t max_count_per_call);
// One rank and no MPI: every collective is the identity (single-GPU tools, benchmarks).
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace yuan
