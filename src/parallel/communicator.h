// Tensor traffic inside one process group (parallel/topology.h): the collectives of data parallelism and the
// point-to-point transfers between pipeline stages. Buffers are the backend's (host memory for the CPU backend,
// device memory for CUDA) and all members call the collectives in the same order. MPI stays the control plane
// (rendezvous, scalars, failure handling: parallel/world.h); an implementation of this interface carries the
// tensors: MpiCommunicator for host buffers, NcclCommunicator (parallel/nccl.h) for GPU memory, and the one-rank
// LocalCommunicator for a process without MPI.
//
// Ranks are the group's own, 0 .. size()-1. Block partitions: reduce_scatter and all_gather take `counts` (one per
// rank); rank r's block starts at sum(counts[0..r)) inside buf.
//
// Completion: host communicators finish every call before returning (stream() is null). A device communicator
// enqueues each operation on its stream() after the work the backend has enqueued so far, and returns at once;
// synchronize() waits for all of them, and is where a failed or hung peer surfaces as an Error.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "util/dtype.h"
#include "util/stream.h"

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
  // Point-to-point, in bytes: one message to `peer` and one from `peer2` in a single call, so that two neighbours
  // exchanging in opposite directions cannot wait on each other; either side may be skipped with 0 bytes. A send
  // completes only once it is received, whatever its size. Pipeline stages use it to pass activations forward and
  // their gradients back.
  virtual void send_recv(const void* send_buf, size_t send_bytes, int peer, void* recv_buf, size_t recv_bytes,
                         int peer2) = 0;
  void send(const void* buf, size_t count, DType t, int peer) {
    send_recv(buf, count * dtype_size(t), peer, nullptr, 0, -1);
  }
  void recv(void* buf, size_t count, DType t, int peer) { send_recv(nullptr, 0, -1, buf, count * dtype_size(t), peer); }
  virtual void barrier() = 0;
  // Sum over ranks of a host scalar (the squared gradient norm); returns after every earlier operation.
  virtual double sum(double x) = 0;
  // The stream the operations run on, or null when each call completes before returning.
  virtual DeviceStream stream() { return nullptr; }
  virtual void synchronize() {}
};

// Start of every rank's block, plus the total at the end; throws unless there is one count per rank.
std::vector<size_t> block_offsets(const std::vector<size_t>& counts, int ranks, const char* what);

// One rank and no MPI: every collective is the identity (single-GPU tools, benchmarks).
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace yuan
