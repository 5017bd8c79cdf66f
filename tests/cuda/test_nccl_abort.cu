// ncclCommAbort while an operation waits for a peer that never joins it, as a watchdog on a dead or stopped peer
// calls it: the wait ends within a deadline, the operation writes nothing, and the peer joining after the abort
// (its memory freed by then) does not write into freed memory. Two ranks, so the test runs itself under mpirun;
// the emulator's NCCL (cuda/emu/nccl.cpp) is MPI, one GPU is enough for it. Only there: bin/test_cuda links no MPI.
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include "gpu_test.h"
#ifdef YUAN_EMU
#include <mpi.h>
#endif

namespace {

#ifdef YUAN_EMU
using yuan::test::DevArray;

constexpr const char* kChildEnv = "YUAN_TEST_NCCL_ABORT_CHILD";

// One rank of the pair. Rank 0 starts an all-reduce that rank 1 joins only once rank 0 has aborted and freed the
// buffer; a thread of rank 0 aborts while its main thread waits in cudaStreamSynchronize.
void abort_pair() {
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
      const auto t0 = std::chrono::steady_clock::now();
      std::thread aborter([comm] {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
      });
      CUDA_CHECK(cudaStreamSynchronize(stream));  // in the all-reduce until the abort
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      aborter.join();
      EXPECT_GE(waited, 0.9) << "the all-reduce completed without its peer";
      EXPECT_LT(waited, 6.0) << "the abort did not end the wait promptly";
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
#endif

TEST(CudaNccl, AbortEndsAnOperationAPeerNeverJoins) {
  YUAN_REQUIRE_GPU();
#ifndef YUAN_EMU
  GTEST_SKIP() << "two ranks of NCCL need two GPUs; this checks the emulator's ncclCommAbort";
#else
  if (std::getenv(kChildEnv)) return abort_pair();
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
#endif
}

}  // namespace
