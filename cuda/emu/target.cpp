// The device the emulator stands for, and what the GPU compiler made of each kernel: the limits a launch is
// checked against (kernel.cpp), cudaGetDeviceProperties's numbers (runtime.cpp) and occupancy's (traffic.cpp) come
// from here, so that they cannot disagree.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>

#include "emulator.h"

namespace yuan::emu {
namespace {

// The CUDA C++ Programming Guide's table of technical specifications per compute capability (8.0, 9.0), the
// occupancy calculator's allocation units, and each part's datasheet for its SMs, clock and memory. The memory
// clock is what makes 2 x clock x bus width the part's bandwidth: 3.35 TB/s for the H100 SXM's HBM3, 2.04 TB/s for
// the A100 SXM4 80GB's HBM2e, 4.8 TB/s for the H200's HBM3e.
constexpr Target kTargets[] = {
    {"h100", "NVIDIA H100 SXM", 9, 0, 132, 1980000, 2619000, 5120, 48 << 10, 227 << 10, 228 << 10, 1 << 10, 128,
     65536, 65536, 256, 2048, 1024, 32, 32},
    {"a100", "NVIDIA A100 SXM4", 8, 0, 108, 1410000, 1593000, 5120, 48 << 10, 163 << 10, 164 << 10, 1 << 10, 128,
     65536, 65536, 256, 2048, 1024, 32, 32},
    {"h200", "NVIDIA H200 SXM", 9, 0, 132, 1980000, 3125000, 6144, 48 << 10, 227 << 10, 228 << 10, 1 << 10, 128,
     65536, 65536, 256, 2048, 1024, 32, 32},
};

const Target* find_target(const std::string& name) {
  for (const Target& t : kTargets)
    if (name == t.name) return &t;
  return nullptr;
}

const Target*& current_target() {
  static const Target* t = [] {
    const char* name = std::getenv("YUAN_EMU_TARGET");
    if (!name || !*name) return &kTargets[0];
    if (const Target* found = find_target(name)) return found;
    std::fprintf(stderr, "cuda emulator: YUAN_EMU_TARGET = '%s': expected one of", name);
    for (const Target& k : kTargets) std::fprintf(stderr, " %s", k.name);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }();
  return t;
}

// The table build/emu/ptxas.txt (cuda/emu/ptxas_table.sh), one line per kernel:
//   mangled-name registers static-shared-bytes spill-stores spill-loads max-threads
// with g++'s spelling of the name; max-threads is 0 for a kernel without __launch_bounds__.
struct PtxasTable {
  std::string path;
  bool loaded = false, exists = false;
  std::unordered_map<std::string, Compiled> kernels;
  std::map<const void*, const Compiled*> by_entry;  // the lookups made, by the kernel's entry
};

std::string default_table() {
  if (const char* p = std::getenv("YUAN_EMU_PTXAS")) return p;
  return YUAN_EMU_PTXAS_TABLE;  // the build's (Makefile)
}

PtxasTable& ptxas_table() {
  static PtxasTable* t = new PtxasTable{default_table(), false, false, {}, {}};
  return *t;
}

// Read when first needed. The first five columns are what older tables and the tests' own hold: a line without
// the sixth states no __launch_bounds__.
void load(PtxasTable& t) {
  t.loaded = true;
  t.kernels.clear();
  t.by_entry.clear();
  FILE* f = std::fopen(t.path.c_str(), "r");
  t.exists = f != nullptr;
  if (!f) return;
  char line[8192], name[4096];
  while (std::fgets(line, sizeof line, f)) {
    Compiled c;
    if (std::sscanf(line, "%4095s %d %zu %*d %*d %d", name, &c.registers, &c.static_shared, &c.max_threads) >= 3)
      t.kernels[name] = c;
  }
  std::fclose(f);
}

}  // namespace

const Target& target() {
  Lock lock(mutex());
  return *current_target();
}

bool set_target(const std::string& name) {
  Lock lock(mutex());
  const Target* t = name.empty() ? &kTargets[0] : find_target(name);
  if (!t) return false;
  current_target() = t;
  return true;
}

void set_ptxas_table(const std::string& path) {
  Lock lock(mutex());
  PtxasTable& t = ptxas_table();
  t.path = path.empty() ? default_table() : path;
  t.loaded = false;
}

const Compiled* compiled(const void* kernel, bool* table_exists) {
  PtxasTable& t = ptxas_table();
  if (!t.loaded) load(t);
  *table_exists = t.exists;
  const auto cached = t.by_entry.find(kernel);
  if (cached != t.by_entry.end()) return cached->second;
  const auto it = t.kernels.find(mangled_name(kernel));
  return t.by_entry[kernel] = it == t.kernels.end() ? nullptr : &it->second;
}

}  // namespace yuan::emu
