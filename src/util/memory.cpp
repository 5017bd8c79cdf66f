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

size_t host_peak_rss_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtoull(line + 6, nullptr, 10);
  std::fclose(f);
  return kb * 1024;
}

}  // namespace yuan
