#include "util/memory.h"

#include <atomic>
#include <cstdio>
#include <cstring>

namespace yuan {

namespace {
constexpr int kCats = static_cast<int>(Mem::kCount);
std::atomic<int64_t> g_live[kCats];
std::atomic<int64_t> g_peak[kCats];
}  // namespace

const char* mem_name(Mem m) {
  static const char* names[kCats] = {"params", "grads", "optimizer", "activations", "data", "comm"};
  return names[static_cast<int>(m)];
}

size_t mem_bytes(Mem m) { return static_cast<size_t>(g_live[static_cast<int>(m)].load()); }
size_t mem_peak_bytes(Mem m) { return static_cast<size_t>(g_peak[static_cast<int>(m)].load()); }

void detail::mem_account(Mem m, std::ptrdiff_t delta) {
  int i = static_cast<int>(m);
  int64_t now = g_live[i].fetch_add(delta) + delta;
  int64_t peak = g_peak[i].load();
  while (now > peak && !g_peak[i].compare_exchange_weak(peak, now)) {
  }
}

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
