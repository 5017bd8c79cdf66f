// The NCCL communicator (src/comm/nccl.h): in-place collectives on the backend's device buffers, on a stream of
// their own that waits for the backend's compute by events, so that backward keeps running while finished
// buckets are reduced.
//
// Failure model: the communicator is nonblocking (ncclConfig_t::blocking = 0), so no NCCL call, initialisation
// included, can block the host indefinitely; every wait (initialisation, enqueueing, synchronize, finalize) polls
// ncclCommGetAsyncError and a deadline. A dead or stuck peer therefore ends as an Error on every surviving rank
// within dist.nccl_timeout_s, after ncclCommAbort has released the GPU side, instead of a hang; past the deadline,
// where the caller asks for it (src/comm/nccl.cpp), as one line for the whole job from its handler instead.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <numeric>
#include <thread>

#include "comm/nccl.h"
#include "cuda_check.h"
#include "kernel_account.cuh"
#include "ops/op_cost.h"

namespace yuan {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::U32: return ncclUint32;
    case DType::U64: return ncclUint64;
    // NCCL has no 16-bit integer type; copies (all_gather, broadcast) move 2-byte words the same either way.
    case DType::U16: case DType::BF16: return ncclBfloat16;
  }
  return ncclFloat32;
}

// u16 travels as bf16 bits: a sum or max would do floating-point arithmetic on integers.
ncclDataType_t nccl_reduce_type(DType t, const char* what) {
  YUAN_CHECK(t != DType::U16, "NCCL communicator: %s over u16 is not supported (NCCL has no 16-bit integers)",
             what);
  return nccl_type(t);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, const NcclId& id, DeviceStream producer, double timeout_s, std::string name,
                   NcclTimeout on_timeout)
      : rank_(rank),
        size_(size),
        producer_(producer),
        timeout_s_(timeout_s),
        name_(std::move(name)),
        on_timeout_(std::move(on_timeout)) {
    YUAN_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL communicator: rank %d of %d", rank, size);
    YUAN_CHECK(timeout_s > 0, "NCCL communicator: timeout %g s must be positive", timeout_s);
    try {
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&ev_producer_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&ev_done_, cudaEventDisableTiming));
      CUDA_CHECK(cudaMalloc(&scalar_dev_, sizeof(double)));
      CUDA_CHECK(cudaMallocHost(&scalar_host_, sizeof(double)));
      ncclUniqueId uid;
      static_assert(sizeof uid == sizeof(NcclId), "ncclUniqueId size");
      std::memcpy(&uid, id.data(), sizeof uid);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      check(ncclCommInitRankConfig(&comm_, size, uid, rank, &config), "ncclCommInitRankConfig");
      settle("ncclCommInitRankConfig");
    } catch (...) {
      // No destructor runs for an object whose constructor threw.
      if (comm_) ncclCommAbort(comm_);
      release();
      throw;
    }
  }

  // Destructors do not throw. Finalizing waits for every peer, so it is only tried on an orderly exit: while an
  // exception unwinds a peer may be dead or stuck, and after a failure the communicator is already aborted
  // (comm_ is null).
  ~NcclCommunicator() override {
    if (comm_) {
      if (std::uncaught_exceptions() == 0 && finalized())
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    release();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceStream stream() override { return stream_; }

 protected:
  void do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    const ncclDataType_t nt = nccl_reduce_type(t, "all_reduce");
    after_producer();
    const gpu::OpScope scope(collective("nccl AllReduce", ops::Collective::AllReduce, count * dtype_size(t)));
    gpu::timed(scope.info.name, stream_, [&] {
      check(ncclAllReduce(buf, buf, count, nt, op == ReduceOp::Sum ? ncclSum : ncclMax, live(), stream_),
            "ncclAllReduce");
      settle("ncclAllReduce");
    });
  }

  void do_reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) override {
    const ncclDataType_t nt = nccl_reduce_type(t, "reduce_scatter");
    const std::vector<size_t> offs = block_offsets(counts, size_, "reduce_scatter");
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    after_producer();
    const size_t bytes = total(counts) * es;
    if (equal(counts)) {
      // In place: NCCL's receive buffer of rank r is exactly block r of the send buffer.
      const gpu::OpScope scope(collective("nccl ReduceScatter", ops::Collective::ReduceScatter, bytes));
      gpu::timed(scope.info.name, stream_, [&] {
        check(ncclReduceScatter(p, p + offs[rank_] * es, counts[0], nt, ncclSum, live(), stream_),
              "ncclReduceScatter");
        settle("ncclReduceScatter");
      });
      return;
    }
    // Uneven blocks: each block reduced onto its owner, one NCCL launch. Buckets are whole modules and seldom end
    // on a shard boundary, so this is the usual path, not an exception; at 2 ranks it moves up to about twice the
    // bytes of a reduce-scatter, still overlapped with backward (the account holds it to a reduce-scatter's).
    const gpu::OpScope scope(collective("nccl Reduce group", ops::Collective::ReduceScatter, bytes));
    gpu::timed(scope.info.name, stream_, [&] {
      grouped(counts, "ncclReduce group", [&](int r, ncclComm_t c) {
        return ncclReduce(p + offs[r] * es, p + offs[r] * es, counts[r], nt, ncclSum, r, c, stream_);
      });
    });
  }

  void do_all_gather(void* buf, const std::vector<size_t>& counts, DType t) override {
    const std::vector<size_t> offs = block_offsets(counts, size_, "all_gather");
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    after_producer();
    const size_t bytes = total(counts) * es;
    if (equal(counts)) {
      const gpu::OpScope scope(collective("nccl AllGather", ops::Collective::AllGather, bytes));
      gpu::timed(scope.info.name, stream_, [&] {
        check(ncclAllGather(p + offs[rank_] * es, p, counts[0], nccl_type(t), live(), stream_), "ncclAllGather");
        settle("ncclAllGather");
      });
      return;
    }
    const gpu::OpScope scope(collective("nccl Broadcast group", ops::Collective::AllGather, bytes));
    gpu::timed(scope.info.name, stream_, [&] {
      grouped(counts, "ncclBroadcast group", [&](int r, ncclComm_t c) {
        return ncclBroadcast(p + offs[r] * es, p + offs[r] * es, counts[r], nccl_type(t), r, c, stream_);
      });
    });
  }

  void do_broadcast(void* buf, size_t count, DType t, int root) override {
    YUAN_CHECK(root >= 0 && root < size_, "broadcast: root %d outside the %d ranks", root, size_);
    after_producer();
    const gpu::OpScope scope(collective("nccl Broadcast", ops::Collective::Broadcast, count * dtype_size(t)));
    gpu::timed(scope.info.name, stream_, [&] {
      check(ncclBroadcast(buf, buf, count, nccl_type(t), root, live(), stream_), "ncclBroadcast");
      settle("ncclBroadcast");
    });
  }

  // A send and a receive in one NCCL group: neighbours exchanging in opposite directions do not wait on each other.
  void do_send_recv(const void* send_buf, size_t send_bytes, int peer, void* recv_buf, size_t recv_bytes,
                 int peer2) override {
    YUAN_CHECK((send_bytes == 0 || (peer >= 0 && peer < size_ && peer != rank_)) &&
                   (recv_bytes == 0 || (peer2 >= 0 && peer2 < size_ && peer2 != rank_)),
               "%s: send to rank %d / receive from rank %d of %d", name_.c_str(), peer, peer2, size_);
    if (send_bytes == 0 && recv_bytes == 0) return;
    after_producer();
    const ncclComm_t c = live();
    // Both directions of a full-duplex link at once: the larger one is what the link must carry.
    const gpu::OpScope scope({"nccl SendRecv", "nccl",
                              {"send=%lld recv=%lld", {static_cast<long long>(send_bytes),
                                                       static_cast<long long>(recv_bytes)}},
                              ops::collective_cost(ops::Collective::SendRecv,
                                                   static_cast<double>(std::max(send_bytes, recv_bytes)), size_),
                              Roof::Link});
    gpu::timed(scope.info.name, stream_, [&] {
      check(ncclGroupStart(), "ncclSend/ncclRecv group");
      ncclResult_t e = ncclSuccess;
      if (send_bytes) e = ncclSend(send_buf, send_bytes, ncclUint8, peer, c, stream_);
      if (!failed(e) && recv_bytes) e = ncclRecv(recv_buf, recv_bytes, ncclUint8, peer2, c, stream_);
      if (failed(e)) {
        ncclGroupEnd();
        fail("ncclSend/ncclRecv", ncclGetErrorString(e));
      }
      check(ncclGroupEnd(), "ncclSend/ncclRecv group");
      settle("ncclSend/ncclRecv");
    });
  }

 public:
  // On the GPU path: a host barrier through MPI could block while a peer still waits inside an NCCL kernel.
  void barrier() override {
    sum(0.0);
  }

  double sum(double x) override {
    *scalar_host_ = x;
    gpu::copy_async(scalar_dev_, scalar_host_, sizeof(double), cudaMemcpyHostToDevice, stream_);
    {
      const gpu::OpScope scope(collective("nccl AllReduce", ops::Collective::AllReduce, sizeof(double)));
      gpu::timed(scope.info.name, stream_, [&] {
        check(ncclAllReduce(scalar_dev_, scalar_dev_, 1, ncclFloat64, ncclSum, live(), stream_),
              "ncclAllReduce (scalar)");
        settle("ncclAllReduce (scalar)");
      });
    }
    gpu::copy_async(scalar_host_, scalar_dev_, sizeof(double), cudaMemcpyDeviceToHost, stream_);
    synchronize();
    return *scalar_host_;
  }

  void synchronize() override {
    CUDA_CHECK(cudaEventRecord(ev_done_, stream_));
    const Deadline d = deadline();
    const std::string what = strf("synchronize after %s", last_op_);
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev_done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) CUDA_CHECK(e);
      poll(d, what.c_str());
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Deadline = Clock::time_point;
  static constexpr std::chrono::microseconds kPollStep{20};
  Deadline deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  ncclComm_t live() const {
    YUAN_CHECK(comm_, "NCCL communicator used after it was aborted (rank %d)", rank_);
    return comm_;
  }

  // ncclInProgress is how a nonblocking communicator accepts work, not a failure.
  static bool failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

  // A call NCCL refused leaves the peers waiting for a collective this rank will never join: abort and throw.
  void check(ncclResult_t r, const char* what) {
    if (failed(r)) fail(what, ncclGetErrorString(r));
  }

  // One NCCL launch of `enqueue(r, comm)` for every rank r with a nonempty block. A failed enqueue closes the
  // group before the abort, whose own result no longer matters.
  template <class Enqueue>
  void grouped(const std::vector<size_t>& counts, const char* what, Enqueue enqueue) {
    const ncclComm_t c = live();
    check(ncclGroupStart(), what);
    for (int r = 0; r < size_; r++) {
      if (counts[r] == 0) continue;
      const ncclResult_t e = enqueue(r, c);
      if (failed(e)) {
        ncclGroupEnd();
        fail(what, ncclGetErrorString(e));
      }
    }
    check(ncclGroupEnd(), what);
    settle(what);
  }

  void after_producer() {
    if (!producer_) return;
    CUDA_CHECK(cudaEventRecord(ev_producer_, producer_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ev_producer_, 0));
  }

  // A nonblocking communicator may still be setting up the last call; nothing else may be issued until it is.
  void settle(const char* what) {
    last_op_ = what;
    const Deadline d = deadline();
    ncclResult_t state = ncclInProgress;
    while ((state = async_state()) == ncclInProgress) poll(d, what);
    if (state != ncclSuccess) fail(what, ncclGetErrorString(state));
  }

  ncclResult_t async_state() {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(live(), &state), "ncclCommGetAsyncError");
    return state;
  }

  // ncclCommFinalize, then its completion polled like every other wait: true once it finished within the
  // deadline without error. Never throws (destructor).
  bool finalized() {
    const Deadline d = deadline();
    ncclResult_t state = ncclCommFinalize(comm_);
    while (state == ncclInProgress && Clock::now() <= d) {
      std::this_thread::sleep_for(kPollStep);
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return false;
    }
    return state == ncclSuccess;
  }

  // One wait step: an asynchronous NCCL error or the deadline ends the job's use of the communicator.
  void poll(const Deadline& d, const char* what) {
    const ncclResult_t state = async_state();
    if (failed(state)) fail(what, ncclGetErrorString(state));
    const Deadline now = Clock::now();
    if (now > d) {
      if (on_timeout_) {
        ncclCommAbort(comm_);  // as in fail(), before the handler's liveness pings
        comm_ = nullptr;
        on_timeout_(what, timeout_s_ + std::chrono::duration<double>(now - d).count());
      }
      fail(what, strf("not complete after dist.nccl_timeout_s = %g s: a peer rank died or is stuck", timeout_s_)
                     .c_str());
    }
    std::this_thread::sleep_for(kPollStep);
  }

  [[noreturn]] void fail(const char* what, const char* why) {
    const std::string last = comm_ ? ncclGetLastError(comm_) : "";
    if (comm_) ncclCommAbort(comm_);  // frees the GPU from kernels that would wait for the peer forever
    comm_ = nullptr;
    throw Error(strf("NCCL error (%s rank %d of %d on %s): %s: %s%s%s", name_.c_str(), rank_, size_,
                     process_host().c_str(), what, why, last.empty() ? "" : "; NCCL says: ", last.c_str()));
  }

  // Null handles are skipped, so this also undoes a constructor that stopped half-way.
  void release() {
    if (scalar_dev_) cudaFree(scalar_dev_);
    if (scalar_host_) cudaFreeHost(scalar_host_);
    if (ev_producer_) cudaEventDestroy(ev_producer_);
    if (ev_done_) cudaEventDestroy(ev_done_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // The kernel account's op for a collective over `bytes` of buffer (kernel_account.cuh, ops/op_cost.h): its
  // roofline is the link, its phase "transfer".
  gpu::OpInfo collective(const char* name, ops::Collective c, size_t bytes) const {
    return {name, "nccl", {"bytes=%lld ranks=%lld", {static_cast<long long>(bytes), size_}},
            ops::collective_cost(c, static_cast<double>(bytes), size_), Roof::Link};
  }

  static size_t total(const std::vector<size_t>& counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t(0));
  }

  static bool equal(const std::vector<size_t>& counts) {
    for (size_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }

  int rank_, size_;
  cudaStream_t producer_;
  double timeout_s_;
  std::string name_;
  NcclTimeout on_timeout_;
  const char* last_op_ = "no operation";  // the latest enqueued, named by a wait in synchronize()
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_producer_ = nullptr, ev_done_ = nullptr;
  double* scalar_dev_ = nullptr;
  double* scalar_host_ = nullptr;  // pinned
};

}  // namespace

NcclId nccl_unique_id() {
  ncclUniqueId uid;
  NCCL_CHECK(ncclGetUniqueId(&uid));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const NcclId& id, DeviceStream producer,
                                                     double timeout_s, const std::string& name,
                                                     NcclTimeout on_timeout) {
  return std::make_unique<NcclCommunicator>(rank, size, id, producer, timeout_s, name, std::move(on_timeout));
}

}  // namespace yuan
