#include "util/memory.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "util/error.h"

namespace yuan {

namespace {
constexpr int kCats = static_cast<int>(Mem::kCount);
std::atomic<int64_t> g_live[kCats];
}  // namespace

size_t mem_bytes(Mem m) { return static_cast<size_t>(g_live[static_cast<int>(m)].load()); }

void detail::mem_account(Mem m, std::ptrdiff_t delta) { g_live[static_cast<int>(m)].fetch_add(delta); }

// The "KEY: N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in bytes; false where there is none.
static bool proc_kb_line(const std::string& path, const char* key, size_t* bytes) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  char line[256];
  bool found = false;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) {
      *bytes = std::strtoull(line + n, nullptr, 10) * 1024;
      found = true;
    }
  std::fclose(f);
  return found;
}

// A "Vm...:" line of /proc/self/status, in bytes (0 where there is none).
static size_t proc_status_bytes(const char* key) {
  size_t bytes = 0;
  proc_kb_line("/proc/self/status", key, &bytes);
  return bytes;
}

size_t host_peak_rss_bytes() { return proc_status_bytes("VmHWM:"); }
size_t host_rss_bytes() { return proc_status_bytes("VmRSS:"); }

const char* mem_name(Mem m) {
  switch (m) {
    case Mem::Params: return "parameters";
    case Mem::Grads: return "gradients";
    case Mem::Optimizer: return "optimizer state";
    case Mem::Activations: return "activations";
    case Mem::Data: return "data buffers";
    case Mem::Comm: return "communication buffers";
    case Mem::kCount: break;
  }
  return "?";
}

namespace {

// The first line of a file, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// A cgroup file holding one byte count ("max" and absurd v1 values mean no limit): nullopt when absent.
bool read_bytes(const std::string& path, size_t* out) {
  const std::string line = first_line(path);
  if (line.empty() || !std::isdigit(static_cast<unsigned char>(line[0]))) return false;
  *out = std::strtoull(line.c_str(), nullptr, 10);
  return true;
}

// "key value" from a memory.stat file (0 when absent).
size_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  size_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

// The room under the cgroup at `dir` and every ancestor up to `mount`: min over the levels with a limit of
// limit - usage + inactive file cache. Inside a cgroup namespace /proc/self/cgroup says "/" and the mount is the
// cgroup itself, so the mount is always looked at.
size_t cgroup_room(const std::string& mount, std::string rel, const char* limit_file, const char* usage_file,
                   const char* inactive_key) {
  size_t room = SIZE_MAX;
  while (true) {
    const std::string dir = mount + rel;
    size_t limit = 0, usage = 0;
    // v1 reports "no limit" as a page-rounded LONG_MAX; anything beyond 2^60 bytes is that.
    if (read_bytes(dir + "/" + limit_file, &limit) && limit < (size_t{1} << 60) &&
        read_bytes(dir + "/" + usage_file, &usage)) {
      const size_t inactive = stat_value(dir + "/memory.stat", inactive_key);
      const size_t used = usage > inactive ? usage - inactive : 0;
      room = std::min(room, limit > used ? limit - used : 0);
    }
    if (rel.empty() || rel == "/") break;
    rel = rel.substr(0, rel.find_last_of('/'));
  }
  return room;
}

// A size with an optional K, M or G suffix (binary); false when malformed.
bool parse_size(const char* text, size_t* out) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || !(v >= 0)) return false;
  double scale = 1;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K': scale = 1024.0, end++; break;
    case 'M': scale = 1024.0 * 1024, end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024, end++; break;
    default: break;
  }
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v * scale);
  return true;
}

}  // namespace

NodeMemory node_available_memory(const std::string& root) {
  NodeMemory m;
  if (const char* hook = std::getenv("YUANLM_NODE_MEMORY")) {
    YUAN_CHECK(parse_size(hook, &m.available), "YUANLM_NODE_MEMORY='%s' is not a byte count (e.g. 2G, 512M)", hook);
    m.source = "YUANLM_NODE_MEMORY";
    return m;
  }
  if (proc_kb_line(root + "/proc/meminfo", "MemAvailable:", &m.available)) m.source = "MemAvailable";
  // Lines of /proc/self/cgroup: "0::/path" (v2) or "N:memory,...:/path" (v1).
  std::ifstream f(root + "/proc/self/cgroup");
  for (std::string line; std::getline(f, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const std::string path = line.substr(b + 1);
    size_t room = SIZE_MAX;
    const char* version = "";
    if (controllers == ",,") {
      room = cgroup_room(root + "/sys/fs/cgroup", path, "memory.max", "memory.current", "inactive_file");
      version = "v2";
    } else if (controllers.find(",memory,") != std::string::npos) {
      room = cgroup_room(root + "/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file");
      version = "v1";
    }
    if (room < m.available) {
      m.available = room;
      m.source = strf("cgroup %s (%s)", path.c_str(), version);
    }
  }
  return m;
}

void detail::out_of_host_memory(size_t bytes, const char* what) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const NodeMemory node = node_available_memory();
  throw Error(strf("out of host memory: %.2f GiB of %s could not be allocated (this node has %.2f GiB available, "
                   "%s); `yuanlm plan` gives what a deck needs", bytes / kGiB, what, node.available / kGiB,
                   node.source.c_str()));
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    u++;
  }
  return strf(u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

}  // namespace yuan
