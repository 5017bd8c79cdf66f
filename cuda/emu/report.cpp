// Reports of the emulator's checks: printed when made, kept until a test takes them, and, for a failed kernel,
// the sticky error every later CUDA call returns (as a GPU's context is lost after a faulting kernel).
#include <cstdarg>
#include <cstdio>
#include <map>
#include <utility>

#include "emulator.h"

namespace yuan::emu {
namespace {

struct Reports {
  std::vector<Report> pending;
  cudaError_t sticky = cudaSuccess;
  std::map<int, std::string> messages;  // by error code: the latest report that returned it
};

Reports& reports() {
  static Reports* r = new Reports;
  return *r;
}

}  // namespace

std::recursive_mutex& mutex() {
  static std::recursive_mutex* m = new std::recursive_mutex;
  return *m;
}

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < static_cast<int>(sizeof buf)) return buf;
  std::string out(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(out.data(), out.size(), fmt, ap);
  va_end(ap);
  out.pop_back();
  return out;
}

const char* check_name(Check c) {
  switch (c) {
    case Check::OutOfBounds: return "out-of-bounds access";
    case Check::UseAfterFree: return "use after free";
    case Check::Misaligned: return "misaligned access";
    case Check::Uninitialised: return "uninitialised read";
    case Check::SharedRace: return "shared-memory race";
    case Check::GlobalRace: return "device-memory race";
    case Check::OrderDependence: return "order-dependent result";
    case Check::StreamRace: return "stream race";
    case Check::BarrierDivergence: return "barrier divergence";
    case Check::WarpDivergence: return "warp divergence";
    case Check::HostMemory: return "host/device memory mix-up";
    case Check::Launch: return "invalid launch";
    case Check::Library: return "refused call";
  }
  return "?";
}

void report(Check c, const Where& where, uintptr_t address, const std::string& what, bool sticky, cudaError_t error) {
  Reports& r = reports();
  Report rep;
  rep.check = c;
  rep.kernel = where.kernel;
  rep.block = where.block;
  rep.thread = where.thread;
  rep.address = address;
  rep.message = std::string("cuda emulator: ") + check_name(c);
  if (!where.kernel.empty()) rep.message += " in kernel " + where.kernel;
  // A refused launch has no thread running yet; an order-dependent result is the whole grid's.
  if (!where.kernel.empty() && c != Check::Launch && c != Check::OrderDependence)
    rep.message += format(", block (%u,%u,%u), thread (%u,%u,%u)", where.block.x, where.block.y, where.block.z,
                          where.thread.x, where.thread.y, where.thread.z);
  rep.message += ": " + what;
  std::fprintf(stderr, "========= %s\n", rep.message.c_str());
  std::fflush(stderr);
  r.messages[error] = rep.message;
  if (sticky && r.sticky == cudaSuccess) r.sticky = error;
  r.pending.push_back(std::move(rep));
}

cudaError_t sticky_error() { return reports().sticky; }

const char* report_message(cudaError_t e) {
  const auto it = reports().messages.find(e);
  return it == reports().messages.end() ? nullptr : it->second.c_str();
}

std::vector<Report> take_reports() {
  Lock lock(mutex());
  Reports& r = reports();
  r.sticky = cudaSuccess;
  r.messages.clear();
  last_error() = cudaSuccess;
  return std::exchange(r.pending, {});
}

size_t pending_reports() {
  Lock lock(mutex());
  return reports().pending.size();
}

}  // namespace yuan::emu
