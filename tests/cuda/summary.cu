// bin/test_cuda runs with GoogleTest's own main (no MPI here); this listener prints the summary line that
// tests/run_tests.sh counts, as tests/main.cpp does for the other suites.
#include <gtest/gtest.h>

#include <cstdio>

namespace {

class Summary : public testing::EmptyTestEventListener {
  void OnTestProgramEnd(const testing::UnitTest& u) override {
    std::printf("gtest-summary: %d passed, %d failed, %d skipped (1 ranks)\n", u.successful_test_count(),
                u.failed_test_count(), u.skipped_test_count());
    std::fflush(stdout);
  }
};

// Registered before main() runs: the listener list exists as soon as the UnitTest singleton does.
const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new Summary);
  return true;
}();

}  // namespace
