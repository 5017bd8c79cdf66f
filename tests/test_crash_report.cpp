// The fatal-signal report (util/crash_report.h): its line for a fault, a signal sent by another process and one the
// process raised itself, cut to any buffer; and, in a child process, a real fault, a stack overflow (on the
// alternate stack) and a handler that replaced the report, each ending the child with the signal itself.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "util/crash_report.h"

namespace yuan {
namespace {

siginfo_t info_of(int code, void* addr, int pid) {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  info.si_code = code;
  if (code > 0) info.si_addr = addr;
  else info.si_pid = pid;
  return info;
}

std::string line(int sig, const siginfo_t& info, size_t size = 512) {
  char out[512];
  const size_t n = format_crash_line(out, size, "rank 3 on node2 (pid 1234)", sig, info, 1234);
  EXPECT_EQ(n, std::strlen(out));
  return std::string(out, n);
}

TEST(CrashReport, Who) {
  char out[64];
  EXPECT_EQ(std::string(out, format_crash_who(out, sizeof out, 3, "node2", 1234)), "rank 3 on node2 (pid 1234)");
  EXPECT_EQ(std::string(out, format_crash_who(out, sizeof out, -1, "", 7)), "rank ? on ? (pid 7)");
  EXPECT_EQ(std::string(out, format_crash_who(out, 12, 0, "node2", 7)), "rank 0 on n");  // cut, terminated
}

TEST(CrashReport, LineSaysTheSignalAndWhereOrWhoFrom) {
  EXPECT_EQ(line(SIGSEGV, info_of(SEGV_MAPERR, reinterpret_cast<void*>(0x10), 0)),
            "yuanlm: rank 3 on node2 (pid 1234): fatal signal 11 (SIGSEGV) at address 0x10 (not mapped); "
            "backtrace:\n");
  EXPECT_EQ(line(SIGBUS, info_of(BUS_ADRERR, reinterpret_cast<void*>(0x7f00deadbeef), 0)),
            "yuanlm: rank 3 on node2 (pid 1234): fatal signal 7 (SIGBUS) at address 0x7f00deadbeef (no such physical "
            "address: a file or tmpfs page past its end); backtrace:\n");
  EXPECT_EQ(line(SIGSEGV, info_of(SI_USER, nullptr, 4321)),
            "yuanlm: rank 3 on node2 (pid 1234): fatal signal 11 (SIGSEGV) sent by pid 4321; backtrace:\n");
  EXPECT_EQ(line(SIGABRT, info_of(SI_TKILL, nullptr, 1234)),
            "yuanlm: rank 3 on node2 (pid 1234): fatal signal 6 (SIGABRT) raised by this process (abort(), an "
            "uncaught exception, a failed check); backtrace:\n");
  EXPECT_EQ(line(SIGFPE, info_of(FPE_INTDIV, nullptr, 0)),
            "yuanlm: rank 3 on node2 (pid 1234): fatal signal 8 (SIGFPE) at address 0x0 (integer divide by zero); "
            "backtrace:\n");
  // Cut short, it is still one whole line.
  const std::string cut = line(SIGSEGV, info_of(SEGV_MAPERR, nullptr, 0), 40);
  EXPECT_EQ(cut.size(), 39u);
  EXPECT_EQ(cut.back(), '\n');
  EXPECT_EQ(cut.find('\n'), cut.size() - 1);
}

struct Child {
  int status = 0;
  std::string err;  // its stderr
};

// Runs `body` in a child process with the signals the report takes at their default action (this test binary has
// Open MPI's handlers on some) and stderr into a pipe; `body` must end the process.
Child run_child(const std::function<void()>& body) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
    body();
    _exit(99);
  }
  close(fds[1]);
  Child c;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) c.err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  EXPECT_EQ(waitpid(pid, &c.status, 0), pid);
  c.err = "[pid " + std::to_string(pid) + "]\n" + c.err;
  return c;
}

// The child's report: its first line (after the pid run_child puts first), and the backtrace lines after it.
void expect_report(const Child& c, int sig, const std::string& says) {
  EXPECT_TRUE(WIFSIGNALED(c.status) && WTERMSIG(c.status) == sig) << "status " << c.status << "\n" << c.err;
  const std::string pid = c.err.substr(5, c.err.find(']') - 5);
  const std::string first = "yuanlm: rank 3 on node2 (pid " + pid + "): " + says;
  EXPECT_NE(c.err.find(first), std::string::npos) << c.err;
  const size_t end = c.err.find("backtrace:\n");
  ASSERT_NE(end, std::string::npos) << c.err;
  const std::string frames = c.err.substr(end);
  EXPECT_NE(frames.find("test_yuanlm("), std::string::npos) << c.err;  // a frame of this binary
  EXPECT_NE(frames.find("libc.so"), std::string::npos) << c.err;
}

volatile uintptr_t g_bad_address = 0x10;
volatile int g_stop_recursion = 0;

int recurse(int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  if (g_stop_recursion) return 0;
  return recurse(depth + 1) + frame[0];  // not a tail call: every level keeps its frame
}

TEST(CrashReport, AFaultIsReportedAndEndsTheProcessWithTheSignal) {
  const Child c = run_child([] {
    install_crash_report();
    set_crash_identity(3, "node2");
    *reinterpret_cast<volatile int*>(g_bad_address) = 1;
  });
  expect_report(c, SIGSEGV, "fatal signal 11 (SIGSEGV) at address 0x10 (not mapped); backtrace:");
}

TEST(CrashReport, AStackOverflowIsReportedOnTheAlternateStack) {
  const Child c = run_child([] {
    install_crash_report();
    set_crash_identity(3, "node2");
    recurse(0);
  });
  expect_report(c, SIGSEGV, "fatal signal 11 (SIGSEGV) at address 0x");
}

TEST(CrashReport, AHandlerThatReplacedTheReportIsTakenBackAndCalledAfterIt) {
  const Child c = run_child([] {
    install_crash_report();
    // A library that puts its own handler on a signal while it starts (as MPI_Init may): set_crash_identity takes
    // the signal back and calls that handler after the report.
    struct sigaction theirs = {};
    theirs.sa_handler = [](int) {
      const char text[] = "their handler ran\n";
      [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, text, sizeof text - 1);
    };
    sigemptyset(&theirs.sa_mask);
    sigaction(SIGBUS, &theirs, nullptr);
    set_crash_identity(3, "node2");
    raise(SIGBUS);
  });
  expect_report(c, SIGBUS, "fatal signal 7 (SIGBUS) raised by this process");
  const size_t report = c.err.find("yuanlm: rank 3"), theirs = c.err.find("their handler ran");
  EXPECT_NE(theirs, std::string::npos) << c.err;
  EXPECT_LT(report, theirs) << c.err;
}

}  // namespace
}  // namespace yuan
