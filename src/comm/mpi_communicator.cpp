#include <climits>
#include <cstring>
#include <numeric>

// The MPI communicator: host buffers over one process group's MPI communicator.
#include "comm/communicator.h"
#include "comm/mpi_group.h"
#include "comm/watchdog.h"
#include "comm/world.h"

namespace yuan::comm {

namespace {

// The type MPI moves. bf16 travels as raw 2-byte words: fine for copies, meaningless for sums.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::U16: case DType::BF16: return MPI_UINT16_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::U64: return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// "data[h.0-h.3] (world ranks 0-3,8-11)": what the watchdog names when a wait in the group overruns.
std::string describe(const ProcessGroup& group) {
  std::string ranks;
  const std::vector<int>& r = group.world_ranks();
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) j++;
    ranks += strf("%s%d", ranks.empty() ? "" : ",", r[i]) + (j > i ? strf("-%d", r[j]) : "");
    i = j + 1;
  }
  return strf("%s (world ranks %s)", group.name().c_str(), ranks.c_str());
}

MPI_Datatype mpi_reduce_type(DType t, const char* what) {
  YUAN_CHECK(t != DType::BF16, "MPI communicator: %s over bf16 is not supported on the host (use f32)", what);
  return mpi_type(t);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const ProcessGroup& group, size_t max_count, bool duplicate)
      : comm_(group.mpi().comm), name_(group.name()), label_(describe(group)), world_ranks_(group.world_ranks()),
        max_count_(max_count), rank_(group.rank()), size_(group.size()),
        owned_(duplicate) {
    YUAN_CHECK(max_count_ >= 1 && max_count_ <= static_cast<size_t>(INT_MAX), "MPI communicator: bad chunk %zu",
               max_count_);
    if (duplicate) {
      Waiting wait("comm_dup", label_.c_str());
      MPI_CHECK(MPI_Comm_dup(group.mpi().comm, &comm_));
    }
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void barrier() override {
    Waiting wait("barrier", label_.c_str());
    MPI_CHECK(MPI_Barrier(comm_));
  }

  double sum(double x) override {
    Waiting wait("sum", label_.c_str());
    if (size_ > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm_));
    return x;
  }

 protected:
  // With one rank every collective is the identity; returning early also keeps MPI away from buffers it cannot
  // read, such as a single GPU's device memory.
  void do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    MPI_Datatype mt = mpi_reduce_type(t, "all_reduce");
    if (size_ == 1) return;
    Waiting wait("all_reduce", label_.c_str());
    MPI_Op mop = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    char* p = static_cast<char*>(buf);
    for (size_t off = 0; off < count; off += max_count_) {
      int n = static_cast<int>(std::min(max_count_, count - off));
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), n, mt, mop, comm_));
    }
  }

  void do_reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) override {
    MPI_Datatype mt = mpi_reduce_type(t, "reduce_scatter");
    std::vector<size_t> offs = block_offsets(counts, size_, "reduce_scatter");
    if (size_ == 1) return;
    Waiting wait("reduce_scatter", label_.c_str());
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    if (offs.back() <= max_count_) {
      std::vector<int> rc(counts.begin(), counts.end());
      MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, p, rc.data(), mt, MPI_SUM, comm_));
      // In place, MPI leaves this rank's block at the start of buf; the contract wants it at its own offset.
      if (offs[rank_] != 0) std::memmove(p + offs[rank_] * es, p, counts[rank_] * es);
      return;
    }
    // Larger than one call may take (int counts, kMpiChunk): reduce each block onto its owner, chunk by chunk.
    for (int r = 0; r < size_; r++) {
      for (size_t off = offs[r]; off < offs[r + 1]; off += max_count_) {
        int n = static_cast<int>(std::min(max_count_, offs[r + 1] - off));
        void* q = p + off * es;
        MPI_CHECK(MPI_Reduce(r == rank_ ? MPI_IN_PLACE : q, r == rank_ ? q : nullptr, n, mt, MPI_SUM, r,
                             comm_));
      }
    }
  }

  void do_all_gather(void* buf, const std::vector<size_t>& counts, DType t) override {
    MPI_Datatype mt = mpi_type(t);
    std::vector<size_t> offs = block_offsets(counts, size_, "all_gather");
    if (size_ == 1) return;
    Waiting wait("all_gather", label_.c_str());
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    if (offs.back() <= max_count_) {
      std::vector<int> rc(counts.begin(), counts.end()), displ(offs.begin(), offs.end() - 1);
      MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, rc.data(), displ.data(), mt, comm_));
      return;
    }
    // Larger than one call may take (int displacements, kMpiChunk): each owner broadcasts its block, chunk by chunk.
    for (int r = 0; r < size_; r++) {
      for (size_t off = offs[r]; off < offs[r + 1]; off += max_count_) {
        int n = static_cast<int>(std::min(max_count_, offs[r + 1] - off));
        MPI_CHECK(MPI_Bcast(p + off * es, n, mt, r, comm_));
      }
    }
  }

  void do_broadcast(void* buf, size_t count, DType t, int root) override {
    YUAN_CHECK(root >= 0 && root < size_, "broadcast: root %d outside the %d ranks", root, size_);
    if (size_ == 1) return;
    Waiting wait("broadcast", label_.c_str());
    char* p = static_cast<char*>(buf);
    for (size_t off = 0; off < count; off += max_count_) {
      int n = static_cast<int>(std::min(max_count_, count - off));
      MPI_CHECK(MPI_Bcast(p + off * dtype_size(t), n, mpi_type(t), root, comm_));
    }
  }

  // Chunk by chunk, each chunk's receive and synchronous send started together and waited for together: two
  // ranks sending to each other at once both proceed, and a send never completes into MPI's buffers before it is
  // received, so an order of transfers that could deadlock does so at every message size, in the tests too.
  void do_send_recv(const void* send_buf, size_t send_bytes, int peer, void* recv_buf, size_t recv_bytes,
                 int peer2) override {
    YUAN_CHECK((send_bytes == 0 || (peer >= 0 && peer < size_ && peer != rank_)) &&
                   (recv_bytes == 0 || (peer2 >= 0 && peer2 < size_ && peer2 != rank_)),
               "%s: send to rank %d / receive from rank %d of %d", name_.c_str(), peer, peer2, size_);
    // The peer this transfer waits for, when there is one: the receive's and the send's, or the only one.
    const int waits_for = recv_bytes == 0 ? peer : send_bytes == 0 || peer == peer2 ? peer2 : -1;
    Waiting wait(recv_bytes == 0 ? "send" : send_bytes == 0 ? "recv" : "send_recv", label_.c_str(),
                 waits_for < 0 ? -1 : world_ranks_[waits_for]);
    const char* sp = static_cast<const char*>(send_buf);
    char* rp = static_cast<char*>(recv_buf);
    for (size_t off = 0; off < std::max(send_bytes, recv_bytes); off += max_count_) {
      MPI_Request req[2];
      int n = 0;
      if (off < recv_bytes)
        MPI_CHECK(MPI_Irecv(rp + off, static_cast<int>(std::min(max_count_, recv_bytes - off)), MPI_BYTE, peer2, 0,
                            comm_, &req[n++]));
      if (off < send_bytes)
        MPI_CHECK(MPI_Issend(sp + off, static_cast<int>(std::min(max_count_, send_bytes - off)), MPI_BYTE, peer, 0,
                             comm_, &req[n++]));
      MPI_CHECK(MPI_Waitall(n, req, MPI_STATUSES_IGNORE));
    }
  }

 private:
  MPI_Comm comm_;
  std::string name_;
  std::string label_;             // the group and its world ranks, for the watchdog
  std::vector<int> world_ranks_;  // by group rank
  size_t max_count_;  // elements per MPI call (MPI counts are int)
  int rank_, size_;
  bool owned_;  // comm_ is this communicator's duplicate of the group's
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& group, size_t max_count_per_call,
                                                    bool duplicate) {
  return std::make_unique<MpiCommunicator>(group, max_count_per_call, duplicate);
}

}  // namespace yuan::comm
