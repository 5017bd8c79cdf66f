// bin/test_cuda runs with GoogleTest's own main (no MPI here); this listener prints the summary line that
// tests/run_tests.sh counts, as tests/main.cpp does for the other suites. Under the emulator (bin/test_cuda_emu) a
// test that passed but left emulator reports behind (a failed check nothing waited for) counts as failed, and a
// run of the whole suite fails if a kernel of cuda/ was never launched.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
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
  // When the whole suite ran: every kernel of cuda/ (kernel_launches' conventional ones) must have run in some
  // test, or a path of the backend goes untested; and a launched kernel of yuan::gpu must follow the *_kernel
  // convention, or a kernel like it that no test launched would not be listed. False when one fails.
  static bool every_kernel_launched(const testing::UnitTest& u) {
    if (u.test_to_run_count() != u.total_test_count()) return true;  // a filtered or sharded run reaches less
    int missing = 0, kernels = 0;
    for (const yuan::emu::KernelLaunches& k : yuan::emu::kernel_launches()) {
      kernels += k.conventional;
      if (k.conventional && k.launches == 0) {
        std::printf("[  FAILED  ] kernel coverage: %s was never launched by any test\n", k.name.c_str());
        missing++;
      }
      if (!k.conventional && k.name.compare(0, 11, "yuan::gpu::") == 0) {
        std::printf("[  FAILED  ] kernel coverage: %s is a kernel of yuan::gpu not named *_kernel (the coverage "
                    "check finds cuda/'s kernels by that name)\n", k.name.c_str());
        missing++;
      }
    }
    // None found would mean the symbol table was unreadable (a stripped binary): nothing was checked.
    if (kernels == 0) {
      std::printf("[  FAILED  ] kernel coverage: no kernel of cuda/ found in the symbol table\n");
      missing++;
    }
    if (missing == 0)
      std::printf("[  PASSED  ] kernel coverage: each of the %d kernels of cuda/ was launched\n", kernels);
    return missing == 0;
  }
  int unreported_ = 0;
#else
  static constexpr int unreported_ = 0;
#endif
  void OnTestProgramEnd(const testing::UnitTest& u) override {
#ifdef YUAN_EMU
    const bool covered = every_kernel_launched(u);
#else
    const bool covered = true;
#endif
    std::printf("gtest-summary: %d passed, %d failed, %d skipped (1 ranks)\n", u.successful_test_count() - unreported_,
                u.failed_test_count() + unreported_ + (covered ? 0 : 1), u.skipped_test_count());
    std::fflush(stdout);
    // GoogleTest's exit status counts only its tests: an uncovered kernel must fail the program all the same.
    if (!covered) std::exit(1);
  }
};

// Registered before main() runs: the listener list exists as soon as the UnitTest singleton does.
const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new Summary);
  return true;
}();

}  // namespace
