// The NCCL communicator (src/dist/nccl.h): in-place collectives on the backend's device buffers, on a stream of
// their own that waits for the backend's compute by events, so that backward keeps running while finished
// buckets are reduced.
//
// Failure model: the communicator is nonblocking (ncclConfig_t::blocking = 0), so no NCCL call, initialisation
// included, can block the host indefinitely; every wait (initialisation, enqueueing, synchronize) polls
// ncclCommGetAsyncError and a deadline. A dead or stuck peer therefore ends as an Error on every surviving rank
// within dist.nccl_timeout_s, after ncclCommAbort has released the GPU side, instead of a hang.
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "cuda_check.h"
#include "dist/nccl.h"

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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, const NcclId& id, void* producer, double timeout_s)
      : rank_(rank), size_(size), producer_(static_cast<cudaStream_t>(producer)), timeout_s_(timeout_s) {
    YUAN_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL communicator: rank %d of %d", rank, size);
    YUAN_CHECK(timeout_s > 0, "NCCL communicator: timeout %g s must be positive", timeout_s);
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
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, uid, rank, &config));
    settle("ncclCommInitRankConfig");
  }

  ~NcclCommunicator() override {
    // Destructors do not throw; after a failure the communicator was already aborted (comm_ is null).
    if (comm_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaFree(scalar_dev_);
    cudaFreeHost(scalar_host_);
    cudaEventDestroy(ev_producer_);
    cudaEventDestroy(ev_done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* stream() override { return stream_; }

  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    after_producer();
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), op == ReduceOp::Sum ? ncclSum : ncclMax, live(),
                             stream_));
    settle("ncclAllReduce");
  }

  void reduce_scatter(void* buf, const std::vector<size_t>& counts, DType t) override {
    const std::vector<size_t> offs = block_offsets(counts, size_, "reduce_scatter");
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    after_producer();
    if (equal(counts)) {
      // In place: NCCL's receive buffer of rank r is exactly block r of the send buffer.
      NCCL_CHECK(ncclReduceScatter(p, p + offs[rank_] * es, counts[0], nccl_type(t), ncclSum, live(), stream_));
      settle("ncclReduceScatter");
      return;
    }
    // Uneven blocks (the padded buffer's last bucket): each block reduced onto its owner, one NCCL launch.
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; r++)
      if (counts[r] > 0)
        NCCL_CHECK(ncclReduce(p + offs[r] * es, p + offs[r] * es, counts[r], nccl_type(t), ncclSum, r, live(),
                              stream_));
    NCCL_CHECK(ncclGroupEnd());
    settle("ncclReduce group");
  }

  void all_gather(void* buf, const std::vector<size_t>& counts, DType t) override {
    const std::vector<size_t> offs = block_offsets(counts, size_, "all_gather");
    char* p = static_cast<char*>(buf);
    const size_t es = dtype_size(t);
    after_producer();
    if (equal(counts)) {
      NCCL_CHECK(ncclAllGather(p + offs[rank_] * es, p, counts[0], nccl_type(t), live(), stream_));
      settle("ncclAllGather");
      return;
    }
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; r++)
      if (counts[r] > 0)
        NCCL_CHECK(ncclBroadcast(p + offs[r] * es, p + offs[r] * es, counts[r], nccl_type(t), r, live(), stream_));
    NCCL_CHECK(ncclGroupEnd());
    settle("ncclBroadcast group");
  }

  void broadcast(void* buf, size_t count, DType t, int root) override {
    YUAN_CHECK(root >= 0 && root < size_, "broadcast: root %d outside the %d ranks", root, size_);
    after_producer();
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(t), root, live(), stream_));
    settle("ncclBroadcast");
  }

  // On the GPU path: a host barrier through MPI could block while a peer still waits inside an NCCL kernel.
  void barrier() override {
    sum(0.0);
  }

  double sum(double x) override {
    *scalar_host_ = x;
    CUDA_CHECK(cudaMemcpyAsync(scalar_dev_, scalar_host_, sizeof(double), cudaMemcpyHostToDevice, stream_));
    NCCL_CHECK(ncclAllReduce(scalar_dev_, scalar_dev_, 1, ncclFloat64, ncclSum, live(), stream_));
    settle("ncclAllReduce (scalar)");
    CUDA_CHECK(cudaMemcpyAsync(scalar_host_, scalar_dev_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return *scalar_host_;
  }

  void synchronize() override {
    CUDA_CHECK(cudaEventRecord(ev_done_, stream_));
    const Deadline d = deadline();
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev_done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) CUDA_CHECK(e);
      poll(d, "synchronize");
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Deadline = Clock::time_point;
  Deadline deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  ncclComm_t live() const {
    YUAN_CHECK(comm_, "NCCL communicator used after it was aborted (rank %d)", rank_);
    return comm_;
  }

  void after_producer() {
    if (!producer_) return;
    CUDA_CHECK(cudaEventRecord(ev_producer_, producer_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ev_producer_, 0));
  }

  // A nonblocking communicator may still be setting up the last call; nothing else may be issued until it is.
  void settle(const char* what) {
    const Deadline d = deadline();
    ncclResult_t state = ncclInProgress;
    while ((state = async_state()) == ncclInProgress) poll(d, what);
    if (state != ncclSuccess) fail(what, ncclGetErrorString(state));
  }

  ncclResult_t async_state() {
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(live(), &state));
    return state;
  }

  // One wait step: an asynchronous NCCL error or the deadline ends the job's use of the communicator.
  void poll(const Deadline& d, const char* what) {
    const ncclResult_t state = async_state();
    if (state != ncclSuccess && state != ncclInProgress) fail(what, ncclGetErrorString(state));
    if (Clock::now() > d)
      fail(what, strf("not complete after dist.nccl_timeout_s = %g s: a peer rank died or is stuck", timeout_s_)
                     .c_str());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

  [[noreturn]] void fail(const char* what, const char* why) {
    const std::string last = comm_ ? ncclGetLastError(comm_) : "";
    if (comm_) ncclCommAbort(comm_);  // frees the GPU from kernels that would wait for the peer forever
    comm_ = nullptr;
    throw Error(strf("NCCL error (rank %d of %d on %s): %s: %s%s%s", rank_, size_, process_host().c_str(), what, why,
                     last.empty() ? "" : "; NCCL says: ", last.c_str()));
  }

  static bool equal(const std::vector<size_t>& counts) {
    for (size_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }

  int rank_, size_;
  cudaStream_t producer_;
  double timeout_s_;
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

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, const NcclId& id, void* producer,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(rank, size, id, producer, timeout_s);
}

}  // namespace yuan
