// bin/test_cuda runs with GoogleTest's own main (no MPI here); this listener prints the summary line that
// tests/run_tests.sh counts, as tests/main.cpp does for the other suites. Under the emulator (bin/test_cuda_emu) a
// test that passed but left emulator reports behind (a failed check nothing waited for) counts as failed.
#include <gtest/gtest.h>

#include <cstdio>
#ifdef YUAN_EMU
#include <cuda_emu.h>
#endif

namespace {

class Summary : public testing::EmptyTestEventListener {
#ifdef YUAN_EMU
  void OnTestEnd(const testing::TestInfo& t) override {
    const std::vector<yuan::emu::Report> left = yuan::emu::take_reports();
    if (left.empty() || t.result()->Failed()) return;
    unreported_++;
    std::printf("[  FAILED  ] %s.%s left %zu emulator report(s), the first: %s\n", t.test_suite_name(), t.name(),
                left.size(), left[0].message.c_str());
  }
  int unreported_ = 0;
#else
  static constexpr int unreported_ = 0;
#endif
  void OnTestProgramEnd(const testing::UnitTest& u) override {
    std::printf("gtest-summary: %d passed, %d failed, %d skipped (1 ranks)\n", u.successful_test_count() - unreported_,
                u.failed_test_count() + unreported_, u.skipped_test_count());
    std::fflush(stdout);
  }
};

// Registered before main() runs: the listener list exists as soon as the UnitTest singleton does.
const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new Summary);
  return true;
}();

}  // namespace
