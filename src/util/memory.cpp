#include "util/memory.h"

#include <atomic>
#include <cstdio>
#include <cstring>

namespace yuan {

namespace {
constexpr int kCats = static_cast<int>(Mem::kCount);
std::atomic<int64_t> g_live[kCats];
}  // namespace

size_t mem_bytes(Mem m) { return static_cast<size_t>(g_live[static_cast<int>(m)].load()); }

void detail::mem_account(Mem m, std::ptrdiff_t delta) { g_live[static_cast<int>(m)].fetch_add(delta); }

// A "Vm...:" line of /proc/self/status, in bytes (0 where there is none).
static size_t proc_status_bytes(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) kb = std::strtoull(line + n, nullptr, 10);
  std::fclose(f);
  return kb * 1024;
}

size_t host_peak_rss_bytes() { return proc_status_bytes("VmHWM:"); }
size_t host_rss_bytes() { return proc_status_bytes("VmRSS:"); }

}  // namespace yuan
