// ncclCommAbort while an operation waits for a peer that never joins it, as a watchdog on a dead or stopped peer
// calls it: the wait ends within a deadline, the operation writes nothing, and the peer joining after the abort
// (its memory freed by then) does not write into freed memory; and the host's wait on device work behind such an
// operation ends at the bound NCCL's deadline sets (bound_device_waits). Two ranks, so the test runs itself under
// mpirun; the emulator's NCCL (cuda/emu/nccl.cpp) is MPI, one GPU is enough for it. Only there: bin/test_cuda links
// no MPI.
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>

#include "comm/nccl.h"
#include "device.cuh"
#include "gpu_test.h"
#ifdef YUAN_EMU
#include <mpi.h>
#endif

namespace {

#ifdef YUAN_EMU
using yuan::test::DevArray;

constexpr const char* kChildEnv = "YUAN_TEST_NCCL_ABORT_CHILD";

// Rank 0 of the pair starts an all-reduce that rank 1 joins only once rank 0 has ended its wait for it (through
// `end_wait`, which must abort the communicator) and freed the buffer.
using EndWait = std::function<void(ncclComm_t comm, cudaStream_t stream)>;

void abort_pair(const EndWait& end_wait) {
  int provided = 0, rank = 0;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ncclUniqueId id;
  if (rank == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, rank), ncclSuccess);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<float> x(1000, rank + 1.0f);
  int go = 1;
  if (rank == 0) {
    {
      DevArray<float> buf(x);
      ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), x.size(), ncclFloat32, ncclSum, comm, stream), ncclSuccess);
      end_wait(comm, stream);
      EXPECT_EQ(buf.download(), x) << "the aborted all-reduce wrote its output";
    }  // the buffer is freed: an access to it now faults
    MPI_Send(&go, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
  } else {
    DevArray<float> buf(x);
    MPI_Recv(&go, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    // Completes with what rank 0's abandoned operation holds: MPI progresses it while rank 0 waits in the barrier.
    ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), x.size(), ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(buf.download(), std::vector<float>(x.size(), 3.0f));
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CUDA_CHECK(cudaStreamDestroy(stream));
  MPI_Finalize();
}

// The calling test again, as both ranks of a pair under mpirun, each running `end_wait`'s side of abort_pair.
void run_as_pair(const EndWait& end_wait) {
  if (std::getenv(kChildEnv)) return abort_pair(end_wait);
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const std::string cmd = yuan::strf(
      "%s=1 timeout 60 mpirun -np 2 --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none "
      "%s --gtest_filter=%s.%s 2>&1",
      kChildEnv, self, t->test_suite_name(), t->name());
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char chunk[4096];
  for (size_t n; (n = fread(chunk, 1, sizeof chunk, p)) > 0;) out.append(chunk, n);
  EXPECT_EQ(pclose(p), 0) << cmd << "\n" << out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
#endif

// A thread of rank 0 aborts while its main thread waits in cudaStreamSynchronize.
TEST(CudaNccl, AbortEndsAnOperationAPeerNeverJoins) {
  YUAN_REQUIRE_GPU();
#ifndef YUAN_EMU
  GTEST_SKIP() << "two ranks of NCCL need two GPUs; this checks the emulator's ncclCommAbort";
#else
  run_as_pair([](ncclComm_t comm, cudaStream_t stream) {
    const auto t0 = std::chrono::steady_clock::now();
    std::thread aborter([comm] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    });
    CUDA_CHECK(cudaStreamSynchronize(stream));  // in the all-reduce until the abort
    const double waited = seconds_since(t0);
    aborter.join();
    EXPECT_GE(waited, 0.9) << "the all-reduce completed without its peer";
    EXPECT_LT(waited, 6.0) << "the abort did not end the wait promptly";
  });
#endif
}

// The host's wait on a compute stream that waits for a collective a peer never joins (the backend's next forward
// behind the step's gathers: src/optim/zero.cpp) ends at the bound bound_device_waits sets, through its handler,
// instead of blocking; a wait on work that completes is not affected by the bound.
TEST(CudaNccl, DeviceWaitBehindAStuckCollectiveEnds) {
  YUAN_REQUIRE_GPU();
#ifndef YUAN_EMU
  GTEST_SKIP() << "two ranks of NCCL need two GPUs; this runs on the emulator's NCCL";
#else
  run_as_pair([](ncclComm_t comm, cudaStream_t nccl_stream) {
    std::vector<std::string> calls;
    yuan::bound_device_waits(1.0, [&calls](const char* op, double waited) {
      calls.push_back(yuan::strf("%s after %.0f s", op, waited));
    });
    cudaStream_t compute;
    cudaEvent_t gathered;
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&gathered, cudaEventDisableTiming));
    DevArray<float> other(std::vector<float>(10, 1.0f));
    CUDA_CHECK(cudaMemsetAsync(other.get(), 0, 10 * sizeof(float), compute));
    yuan::gpu::wait_stream(compute, "work that completes");
    EXPECT_TRUE(calls.empty());
    CUDA_CHECK(cudaEventRecord(gathered, nccl_stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, gathered, 0));
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      yuan::gpu::wait_stream(compute, "the next forward");
    } catch (const yuan::Error& e) {
      error = e.what();
    }
    const double waited = seconds_since(t0);
    EXPECT_GE(waited, 0.9) << "the wait ended before its bound";
    EXPECT_LT(waited, 6.0) << "the bound did not end the wait promptly";
    EXPECT_EQ(calls, std::vector<std::string>{"a device synchronize (the next forward) after 1 s"});
    EXPECT_NE(error.find("a device synchronize (the next forward) not complete after dist.nccl_timeout_s = 1 s"),
              std::string::npos)
        << error;
    yuan::bound_device_waits(0, {});
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);  // as the job's handler would before ending it
    CUDA_CHECK(cudaStreamSynchronize(compute));
    CUDA_CHECK(cudaEventDestroy(gathered));
    CUDA_CHECK(cudaStreamDestroy(compute));
  });
#endif
}

}  // namespace
