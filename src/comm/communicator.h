// Tensor traffic inside one process group (layout/topology.h): the collectives of data parallelism and the
// point-to-point transfers between pipeline stages. Buffers are the backend's (host memory for the CPU backend,
// device memory for CUDA) and all members call the collectives in the same order. MPI stays the control plane
// (rendezvous, scalars, failure handling: comm/world.h); an implementation of this interface carries the
// tensors: MpiCommunicator for host buffers, NcclCommunicator (comm/nccl.h) for GPU memory, and the one-rank
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
#include <cstdint>
#include <memory>
#include <vector>

#include "util/dtype.h"
#include "util/stream.h"

namespace yuan {

enum class ReduceOp { Sum, Max };

// The tensor bytes a communicator moved, by kind of operation: what the callers handed over (the buffer of an
// all-reduce, a reduce-scatter or an all-gather, a broadcast's, the bytes sent), not what the transport put on the
// wire (a ring all-reduce sends 2(N-1)/N of its buffer). Scalars (sum) are control, not counted.
enum class CommOp { AllReduce, ReduceScatter, AllGather, Broadcast, Send, kCount };
const char* comm_op_name(CommOp op);  // "all_reduce", ...
struct Traffic {
  uint64_t bytes[static_cast<int>(CommOp::kCount)] = {};
};

// Implementations provide the do_* operations; the public ones count the traffic and call them.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) {
    count_op(CommOp::AllReduce, count * dtype_size(t));
    do_all_reduce(buf, count, t, op);
  }
  // On return this rank's block of buf holds the sum over ranks of that block; other blocks are undefined.
  void reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) {
    count_op(CommOp::ReduceScatter, elements(counts) * dtype_size(t));
    do_reduce_scatter(buf, counts, t);
  }
  // On entry this rank's block holds its data; on return every block holds its owner's data.
  void all_gather(void* buf, const std::vector<size_t>& counts, DType t) {
    count_op(CommOp::AllGather, elements(counts) * dtype_size(t));
    do_all_gather(buf, counts, t);
  }
  void broadcast(void* buf, size_t count, DType t, int root) {
    count_op(CommOp::Broadcast, count * dtype_size(t));
    do_broadcast(buf, count, t, root);
  }
  // Point-to-point, in bytes: one message to `peer` and one from `peer2` in a single call, so that two neighbours
  // exchanging in opposite directions cannot wait on each other; either side may be skipped with 0 bytes. A send
  // completes only once it is received, whatever its size. Pipeline stages use it to pass activations forward and
  // their gradients back.
  void send_recv(const void* send_buf, size_t send_bytes, int peer, void* recv_buf, size_t recv_bytes, int peer2) {
    if (send_bytes) count_op(CommOp::Send, send_bytes);
    do_send_recv(send_buf, send_bytes, peer, recv_buf, recv_bytes, peer2);
  }
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
  // Where the traffic is added up (null: nowhere); several communicators may share one account.
  void count_into(Traffic* account) { account_ = account; }

 protected:
  virtual void do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) = 0;
  virtual void do_reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) = 0;
  virtual void do_all_gather(void* buf, const std::vector<size_t>& counts, DType t) = 0;
  virtual void do_broadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual void do_send_recv(const void* send_buf, size_t send_bytes, int peer, void* recv_buf, size_t recv_bytes,
                            int peer2) = 0;

 private:
  static size_t elements(const std::vector<size_t>& counts);
  void count_op(CommOp op, uint64_t bytes) {
    if (!account_ || size() == 1) return;  // a group of one rank moves nothing
    account_->bytes[static_cast<int>(op)] += bytes;
  }
  Traffic* account_ = nullptr;
};

// Start of every rank's block, plus the total at the end; throws unless there is one count per rank.
std::vector<size_t> block_offsets(const std::vector<size_t>& counts, int ranks, const char* what);

// One rank and no MPI: every collective is the identity (single-GPU tools, benchmarks).
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace yuan
