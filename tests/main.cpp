// GoogleTest main for single-process and mpirun runs alike. Each test's outcome is agreed over all ranks (a
// test fails if it failed on any rank) and rank 0 prints the only report, ending with the summary line that
// tests/run_tests.sh counts.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "comm/world.h"
#include "util/threads.h"

namespace {

class RankAggregator : public testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const testing::TestInfo& info) override {
    int mine[2] = {info.result()->Failed() ? 1 : 0, info.result()->Skipped() ? 1 : 0}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (all[0]) {
      failed_++;
      if (yuan::comm::world().rank == 0 && !mine[0])
        std::printf("[  FAILED  ] %s.%s failed on another rank\n", info.test_suite_name(), info.name());
    } else if (all[1]) {
      skipped_++;
    } else {
      passed_++;
    }
  }
  void OnTestProgramEnd(const testing::UnitTest&) override {
    if (yuan::comm::world().rank == 0)
      std::printf("gtest-summary: %d passed, %d failed, %d skipped (%d ranks)\n", passed_, failed_, skipped_,
                  yuan::comm::world().size);
    std::fflush(stdout);
  }
  int failed() const { return failed_; }

 private:
  int passed_ = 0, failed_ = 0, skipped_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  yuan::prepare_blas_environment();  // before MPI's threads (util/threads.h)
  yuan::comm::init(&argc, &argv);
  yuan::configure_threads(yuan::comm::world().local_size);
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (yuan::comm::world().rank != 0) delete listeners.Release(listeners.default_result_printer());
  auto* agg = new RankAggregator;
  listeners.Append(agg);
  int rc = RUN_ALL_TESTS();
  rc = agg->failed() > 0 || rc != 0 ? 1 : 0;
  yuan::comm::finalize();
  return rc;
}
