// What a launch does to memory as a GPU's memory system sees it, and its theoretical occupancy on the target device
// (target.cpp), for the launches that ask (Launch::traffic; docs/EMULATOR.md, "Traffic"). While one runs its first time, checks.cpp hands
// every access of device or shared memory that passed the checks to count_access, made by the running thread
// (t_running), and tells count_first_touches which device bytes the launch touches for the first time.
//
// A warp-wide request is what the lanes of one warp do at one access site (the code address of the access) for the
// n-th time each. Lanes run one after another here, not in lockstep, so the site and the count stand in for the
// instruction a warp issues: a lane that skips a branch does not shift the others' requests. A request is complete
// when every lane of its warp has made its access, or when the block ends (lanes that diverged); blocks never
// overlap, so what is kept is one block's open requests and per-lane counts, dropped when it ends.
#include <algorithm>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "emulator.h"

namespace yuan::emu {

Counter* counter = nullptr;

namespace {

constexpr uintptr_t kSectorBytes = 32;  // the unit a global request fetches
constexpr int kBanks = 32;              // shared memory: 32 banks of 4-byte words
// A site is a finding when it wastes at least this share of what its launch moves: a warp reading one float (a
// row's mean) wastes most of its sector, but no kernel is slower for it.
constexpr double kFindingShare = 0.1;
constexpr size_t kFindingsOfAKind = 2;
// Requests that use at least this many times the bytes the launch touches read something again.
constexpr double kRereadRatio = 1.25;

struct Piece {  // one lane's access in a request
  uintptr_t a;
  uint32_t n, lane;
};

struct Request {
  int count = 0;  // lanes that made their access
  Piece pieces[32];
};

struct RequestKey {
  uintptr_t pc;
  uint32_t nth;  // each lane's nth access at pc
  uint16_t warp;
  bool global;
  bool operator==(const RequestKey& o) const {
    return pc == o.pc && nth == o.nth && warp == o.warp && global == o.global;
  }
};
struct RequestHash {
  size_t operator()(const RequestKey& k) const {
    return (k.pc * 0x9e3779b97f4a7c15ull) ^ (uint64_t(k.nth) << 16) ^ (uint64_t(k.warp) << 1) ^ k.global;
  }
};

struct Site {  // one access site's requests over the launch
  uint64_t requests = 0;
  uint64_t sectors = 0, used = 0;        // global memory
  uint64_t fewest = 0;                   // the sectors the used bytes would fill: one lane's load wastes none
  uint64_t wavefronts = 0, phases = 0;   // shared memory: phases are the fewest wavefronts the requests could take
};

// Resident warps per SM over the most the target holds: blocks fit as registers (allocated per warp, in its units),
// warps, blocks and shared memory (in its units, plus what it reserves per block) allow.
double occupancy(int registers, size_t shared_bytes, unsigned threads) {
  const Target& d = target();
  const int warps = static_cast<int>((threads + d.warp_size - 1) / d.warp_size);
  const int warps_per_sm = d.threads_per_sm / d.warp_size;
  const int per_warp = (registers * d.warp_size + d.register_unit - 1) / d.register_unit * d.register_unit;
  int blocks = std::min(d.blocks_per_sm, warps_per_sm / warps);
  if (per_warp > 0) blocks = std::min(blocks, d.registers_per_sm / (per_warp * warps));
  const size_t shared =
      (shared_bytes + d.shared_unit - 1) / d.shared_unit * d.shared_unit + d.shared_reserved_per_block;
  blocks = std::min(blocks, static_cast<int>(d.shared_per_sm / shared));
  return static_cast<double>(blocks * warps) / warps_per_sm;
}

}  // namespace

struct Counter {
  Launch launch;
  int threads = 0;
  Traffic totals;
  std::unordered_map<uint64_t, uint32_t> seen;  // pc << 10 | thread: the thread's accesses at pc so far
  std::unordered_map<RequestKey, Request, RequestHash> open;
  std::unordered_map<uintptr_t, Site> global_sites, shared_sites;
  std::vector<uintptr_t> words;  // scratch of complete_shared
};

namespace {

// A global request's distinct bytes and the distinct 32-byte sectors holding them.
void complete_global(Counter& c, uintptr_t pc, Request& r) {
  std::sort(r.pieces, r.pieces + r.count, [](const Piece& x, const Piece& y) { return x.a < y.a; });
  uint64_t used = 0, sectors = 0;
  uintptr_t next_byte = 0, next_sector = 0;  // the first byte and sector above those counted
  for (int i = 0; i < r.count; i++) {
    const uintptr_t begin = r.pieces[i].a, end = begin + r.pieces[i].n;
    if (end > std::max(begin, next_byte)) used += end - std::max(begin, next_byte);
    next_byte = std::max(next_byte, end);
    const uintptr_t first = std::max(begin / kSectorBytes, next_sector), last = (end - 1) / kSectorBytes;
    if (last >= first) sectors += last - first + 1;
    next_sector = std::max(next_sector, last + 1);
  }
  Site& s = c.global_sites[pc];
  s.requests++;
  s.sectors += sectors;
  s.used += used;
  s.fewest += (used + kSectorBytes - 1) / kSectorBytes;
  c.totals.requests++;
  c.totals.sectors += sectors;
  c.totals.used_bytes += used;
}

// A shared request's wavefronts: its lanes go through the banks in phases, as many lanes at a time as move 128
// bytes (all 32 for 4-byte accesses, 16 for 8-byte, 8 for 16-byte); in a phase a bank serves one 4-byte word per
// wavefront, and lanes reading the same word share it.
void complete_shared(Counter& c, uintptr_t pc, const Request& r) {
  uint32_t width = 0;
  for (int i = 0; i < r.count; i++) width = std::max(width, r.pieces[i].n);
  const uint32_t lanes = width <= 4 ? 32 : width <= 8 ? 16 : 8;
  uint64_t wavefronts = 0, phases = 0;
  for (uint32_t phase = 0; phase < 32 / lanes; phase++) {
    c.words.clear();
    for (int i = 0; i < r.count; i++) {
      const Piece& p = r.pieces[i];
      if (p.lane / lanes != phase) continue;
      for (uintptr_t w = p.a / 4; w <= (p.a + p.n - 1) / 4; w++) c.words.push_back(w);
    }
    if (c.words.empty()) continue;
    std::sort(c.words.begin(), c.words.end());
    c.words.erase(std::unique(c.words.begin(), c.words.end()), c.words.end());
    int per_bank[kBanks] = {}, most = 0;
    for (uintptr_t w : c.words) most = std::max(most, ++per_bank[w % kBanks]);
    wavefronts += most;
    phases++;
  }
  Site& s = c.shared_sites[pc];
  s.requests++;
  s.wavefronts += wavefronts;
  s.phases += phases;
  c.totals.shared_requests++;
  c.totals.bank_conflicts += wavefronts - phases;
}

void complete(Counter& c, const RequestKey& k, Request& r) {
  if (k.global)
    complete_global(c, k.pc, r);
  else
    complete_shared(c, k.pc, r);
}

// The sites that waste most, worst first, at most kFindingsOfAKind of each kind, and whether requests read bytes
// again.
std::vector<std::string> findings(const Counter& c) {
  const Traffic& t = c.totals;
  std::vector<std::string> out;
  auto worst = [&](const std::unordered_map<uintptr_t, Site>& sites, auto waste, uint64_t of, auto say) {
    std::vector<std::pair<uint64_t, uintptr_t>> ranked;
    for (const auto& [pc, s] : sites) {
      const uint64_t w = waste(s);
      if (w > 0 && w >= kFindingShare * of) ranked.emplace_back(w, pc);
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < ranked.size() && i < kFindingsOfAKind; i++)
      out.push_back(say(code_site(reinterpret_cast<const void*>(ranked[i].second)), sites.at(ranked[i].second)));
  };
  // Uncoalesced: a site fetching more than twice the sectors its bytes would fill.
  worst(c.global_sites,
        [](const Site& s) { return s.sectors > 2 * s.fewest ? (s.sectors - s.fewest) * kSectorBytes : 0; },
        t.sectors * kSectorBytes, [](const std::string& at, const Site& s) {
          return format("uncoalesced: %s: %.1f sectors for %.1f bytes used per request (efficiency %.2f)", at.c_str(),
                        double(s.sectors) / s.requests, double(s.used) / s.requests,
                        double(s.used) / double(s.sectors * kSectorBytes));
        });
  uint64_t wavefronts = 0;
  for (const auto& [pc, s] : c.shared_sites) wavefronts += s.wavefronts;
  worst(c.shared_sites, [](const Site& s) { return s.wavefronts - s.phases; }, wavefronts,
        [](const std::string& at, const Site& s) {
          return format("bank conflicts: %s: %.1f wavefronts per request (%.1f ideal)", at.c_str(),
                        double(s.wavefronts) / s.requests, double(s.phases) / s.requests);
        });
  const uint64_t touched = t.touched_bytes();
  if (touched > 0 && double(t.used_bytes) >= kRereadRatio * double(touched))
    out.push_back(format("re-read: the launch fetched %.1fx the bytes it touched (its requests used each byte %.1f "
                         "times)",
                         double(t.sectors * kSectorBytes) / double(touched), double(t.used_bytes) / double(touched)));
  return out;
}

}  // namespace

void begin_traffic(const Launch& l) {
  counter = new Counter;
  counter->launch = l;
  counter->threads = static_cast<int>(l.block.x * l.block.y * l.block.z);
}

void count_access(Counter& c, uintptr_t a, size_t n, bool global, const void* pc) {
  const ThreadSite& me = *t_running;
  const uintptr_t code = reinterpret_cast<uintptr_t>(pc);
  const RequestKey k{code, c.seen[code << 10 | static_cast<unsigned>(me.tid)]++, static_cast<uint16_t>(me.warp),
                     global};
  Request& r = c.open[k];
  r.pieces[r.count++] = Piece{a, static_cast<uint32_t>(n), static_cast<uint32_t>(me.lane)};
  if (r.count < std::min(32, c.threads - 32 * me.warp)) return;
  complete(c, k, r);
  c.open.erase(k);
}

void count_first_touches(Counter& c, uint64_t read, uint64_t written) {
  c.totals.read_bytes += read;
  c.totals.written_bytes += written;
}

void end_block_traffic(Counter& c) {
  for (auto& [k, r] : c.open) complete(c, k, r);
  c.open.clear();
  c.seen.clear();
}

void end_traffic(Traffic* out) {
  Counter& c = *counter;
  Traffic& t = c.totals;
  bool table = false;
  if (const Compiled* k = compiled(c.launch.kernel, &table)) {  // the launch runs under the emulator's lock
    t.registers = k->registers;
    t.occupancy = occupancy(k->registers, k->static_shared + c.launch.shared_bytes, c.threads);
  }
  t.findings = findings(c);
  *out = std::move(t);
  delete counter;
  counter = nullptr;
}

}  // namespace yuan::emu
