#include "util/crash_report.h"

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace yuan {
namespace {

// Text built in a caller's buffer with no allocation: what a signal handler may do.
struct Text {
  char* out;
  size_t size, n = 0;
  Text(char* o, size_t s) : out(o), size(s) {
    if (size > 0) out[0] = '\0';
  }
  Text& put(const char* s) {
    while (*s && n + 1 < size) out[n++] = *s++;
    if (size > 0) out[n] = '\0';
    return *this;
  }
  Text& dec(long long v) {
    char d[24];
    int i = 0;
    const bool negative = v < 0;
    unsigned long long u = negative ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do {
      d[i++] = static_cast<char>('0' + u % 10);
    } while ((u /= 10) != 0);
    if (negative) d[i++] = '-';
    char s[24];
    for (int j = 0; j < i; j++) s[j] = d[i - 1 - j];
    s[i] = '\0';
    return put(s);
  }
  Text& hex(uintptr_t v) {
    char s[2 + 2 * sizeof v + 1] = "0x";
    int i = 2;
    bool started = false;
    for (int shift = 8 * sizeof v - 4; shift >= 0; shift -= 4) {
      const unsigned digit = (v >> shift) & 0xf;
      if (!digit && !started && shift > 0) continue;
      started = true;
      s[i++] = "0123456789abcdef"[digit];
    }
    s[i] = '\0';
    return put(s);
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
  }
}

// What the kernel says of a fault, where it says something a reader can use.
const char* fault_kind(int sig, int code) {
  if (sig == SIGSEGV && code == SEGV_MAPERR) return "not mapped";
  if (sig == SIGSEGV && code == SEGV_ACCERR) return "no access";
  if (sig == SIGBUS && code == BUS_ADRERR) return "no such physical address: a file or tmpfs page past its end";
  if (sig == SIGBUS && code == BUS_ADRALN) return "misaligned";
  if (sig == SIGFPE && code == FPE_INTDIV) return "integer divide by zero";
  if (sig == SIGFPE && code == FPE_INTOVF) return "integer overflow";
  if (sig == SIGILL && code == ILL_ILLOPC) return "illegal opcode";
  return nullptr;
}

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kMaxSignal = 32;

// The line's `who`, in two buffers: set_crash_identity writes the one not in use and then publishes it, so that a
// handler running meanwhile on another thread reads a whole text.
char g_who[2][320];
std::atomic<int> g_current{0};
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

// A handler that was in place for a signal before the report took it (at install, or from a library that replaced
// the report while MPI started): called after the report. sa_handler SIG_DFL: none.
struct sigaction g_previous[kMaxSignal];
std::atomic<bool> g_installed{false};
std::atomic<int> g_reporting{0};  // a handler called after the report may raise the signal again: report once
alignas(16) char g_alt_stack[1 << 16];  // the main thread's handler stack: its own has no room after an overflow

void write_all(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (g_reporting.fetch_add(1) == 0) {
    char line[512];
    write_all(line, format_crash_line(line, sizeof line, g_who[g_current.load()], sig, *info, getpid()));
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    const struct sigaction& prev = g_previous[sig];
    if (prev.sa_flags & SA_SIGINFO) {
      if (prev.sa_sigaction) prev.sa_sigaction(sig, info, context);
    } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
      prev.sa_handler(sig);
    }
  }
  // The default action, whatever a handler called above left in place: the signal, raised while blocked here, is
  // delivered when this returns (and a fault would happen again at the same instruction), and ends the process.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
  errno = saved_errno;
}

bool is_report(const struct sigaction& sa) {
  return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == on_fatal_signal;
}

// Puts the report on `sig`, keeping a handler that was there (not the default, not ignored, not the report) to call
// after it.
void take_signal(int sig) {
  struct sigaction old = {};
  if (sigaction(sig, nullptr, &old) != 0 || is_report(old)) return;
  // Kept before the report is in place, so that a handler running at once finds it.
  if ((old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN))
    sigaction(sig, nullptr, &g_previous[sig]);  // queried into place: a copy of `old` trips GCC 12's -Wdangling-pointer
  struct sigaction sa = {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

void set_who(int rank, const char* node) {
  const int next = 1 - g_current.load();
  format_crash_who(g_who[next], sizeof g_who[next], rank, node, getpid());
  g_current.store(next);
}

}  // namespace

size_t format_crash_who(char* out, size_t size, int rank, const char* node, int pid) {
  Text t(out, size);
  t.put("rank ");
  if (rank >= 0) t.dec(rank);
  else t.put("?");
  return t.put(" on ").put(node && *node ? node : "?").put(" (pid ").dec(pid).put(")").n;
}

size_t format_crash_line(char* out, size_t size, const char* who, int sig, const siginfo_t& info, int self) {
  Text t(out, size);
  t.put("yuanlm: ").put(who).put(": fatal signal ").dec(sig).put(" (").put(signal_name(sig)).put(")");
  if (info.si_code <= 0) {  // sent (kill, tgkill, sigqueue, abort's raise), not a fault of an instruction
    if (info.si_pid == self) t.put(" raised by this process (abort(), an uncaught exception, a failed check)");
    else t.put(" sent by pid ").dec(info.si_pid);
  } else if (sig != SIGABRT) {
    t.put(" at address ").hex(reinterpret_cast<uintptr_t>(info.si_addr));
    if (const char* kind = fault_kind(sig, info.si_code)) t.put(" (").put(kind).put(")");
  }
  t.put("; backtrace:\n");
  if (t.n > 0 && out[t.n - 1] != '\n') out[t.n - 1] = '\n';  // cut short: still one whole line
  return t.n;
}

void install_crash_report() {
  if (g_installed.exchange(true)) return;
  // Before MPI_Init, the rank is known only from the launcher's environment (as comm::StartupDeadline says).
  const char* rank = nullptr;
  for (const char* key : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (!rank) rank = std::getenv(key);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  set_who(rank && *rank >= '0' && *rank <= '9' ? std::atoi(rank) : -1, host);
  // backtrace() loads libgcc's unwinder on its first call (dlopen, malloc): done here, not in a handler.
  void* frame[1];
  backtrace(frame, 1);
  stack_t ss = {};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof g_alt_stack;
  sigaltstack(&ss, nullptr);
  for (int sig : kSignals) take_signal(sig);
}

void set_crash_identity(int rank, const char* node) {
  set_who(rank, node);
  if (!g_installed.load()) return;
  for (int sig : kSignals) take_signal(sig);
}

}  // namespace yuan
