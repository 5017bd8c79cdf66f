// The happens-before check between operations. Every byte range of device and pinned memory that an operation
// touched has a history: the operation that wrote it last and the ones that read it since (the latest of each
// stream: a later read of a stream is ordered after its earlier ones, so a write ordered after it is ordered after
// them too). An operation's accesses, gathered while it runs (copies, memsets, NCCL, cuBLASLt and cuDNN from their
// ranges, kernels from the race cells' first touch of each byte in the launch, checks.cpp), are held to that history
// when it completes: a read must be ordered after the last write, a write after the last write and every read
// since. "Ordered" is the vector clocks of streams.cpp, which come from the event waits and synchronisations CUDA
// guarantees, not from when the emulator ran the work; so a missing wait is reported in every stream mode. The
// emulator runs work in an order CUDA allows, so checking against the latest history finds a race whenever there is
// one (the first of them, as a race detector over one execution does).
#include <algorithm>
#include <map>
#include <utility>

#include "emulator.h"

namespace yuan::emu {
namespace {

using Range = std::pair<uintptr_t, uintptr_t>;

struct Segment {
  uintptr_t end;
  std::shared_ptr<const Operation> writer;                // null: nothing tracked wrote it (host data, say)
  std::vector<std::shared_ptr<const Operation>> readers;  // since the write, one per stream
};

// Disjoint segments by start; neighbours with the same history are merged, so a buffer written whole is one.
std::map<uintptr_t, Segment>& history() {
  static auto* h = new std::map<uintptr_t, Segment>;
  return *h;
}

bool tracked(uintptr_t a) { return in_arena(Space::Device, a) || in_arena(Space::Pinned, a); }

// Sorted, overlapping and adjacent ranges merged.
void normalise(std::vector<Range>& v) {
  if (v.size() < 2) return;
  std::sort(v.begin(), v.end());
  size_t out = 0;
  for (size_t i = 1; i < v.size(); i++) {
    if (v[i].first <= v[out].second)
      v[out].second = std::max(v[out].second, v[i].second);
    else
      v[++out] = v[i];
  }
  v.resize(out + 1);
}

// A segment boundary at `at`, so that a range starting or ending there covers whole segments.
void split(uintptr_t at) {
  auto& h = history();
  auto it = h.upper_bound(at);
  if (it == h.begin()) return;
  --it;
  if (it->first < at && at < it->second.end) {
    Segment tail = it->second;
    it->second.end = at;
    h.emplace(at, std::move(tail));
  }
}

bool same_history(const Segment& a, const Segment& b) { return a.writer == b.writer && a.readers == b.readers; }

// Merges the segments touching [b, e] with their neighbours where the history is the same.
void coalesce(uintptr_t b, uintptr_t e) {
  auto& h = history();
  auto it = h.lower_bound(b);
  if (it != h.begin()) --it;
  while (it != h.end() && it->first <= e) {
    auto next = std::next(it);
    if (next != h.end() && it->second.end == next->first && same_history(it->second, next->second)) {
      it->second.end = next->second.end;
      h.erase(next);
    } else {
      it = next;
    }
  }
}

std::string describe(const Operation& op) {
  std::string what = op.kernel ? "kernel " + function_name(op.kernel)
                     : op.call ? format("%s (called from %s)", op.call, function_name(op.caller).c_str())
                     : op.stream == 0 ? std::string("a host access")
                                      : std::string("an operation");
  return what + " on " + stream_name(op.stream);
}

// Reports the first unordered pair: `op`'s access of [b, e) against `other`'s.
void report_race(const Operation& op, bool write, const Operation& other, bool other_wrote, uintptr_t b,
                 uintptr_t e) {
  const Allocation* al = allocation_near(b);
  const std::string where =
      al ? format("bytes %zu to %zu of the %zu-byte %s allocation at 0x%zx", b - al->begin, e - al->begin, al->bytes,
                  al->space == Space::Device ? "device" : "pinned host", al->begin)
         : format("bytes 0x%zx to 0x%zx", b, e);
  report(Check::StreamRace, Where{}, b,
         format("%s %s %s, which %s %s with no event wait or synchronisation ordering the two",
                describe(op).c_str(), write ? "writes" : "reads", where.c_str(), describe(other).c_str(),
                other_wrote ? "wrote" : "read"),
         true, cudaErrorLaunchFailure);
}

// False, after a report, when an access of [b, e) by `op` is not ordered after the history it overlaps.
bool check(const Operation& op, uintptr_t b, uintptr_t e, bool write) {
  auto& h = history();
  auto it = h.upper_bound(b);
  if (it != h.begin() && std::prev(it)->second.end > b) --it;
  for (; it != h.end() && it->first < e; ++it) {
    const Segment& s = it->second;
    const uintptr_t lo = std::max(b, it->first), hi = std::min(e, s.end);
    if (s.writer && !ordered(*s.writer, op)) {
      report_race(op, write, *s.writer, true, lo, hi);
      return false;
    }
    if (!write) continue;
    for (const auto& r : s.readers)
      if (!ordered(*r, op)) {
        report_race(op, true, *r, false, lo, hi);
        return false;
      }
  }
  return true;
}

void record_write(const std::shared_ptr<Operation>& op, uintptr_t b, uintptr_t e) {
  if (op->stream != 0 && in_arena(Space::Pinned, b)) release_owned_pinned(b, e, op.get());
  auto& h = history();
  split(b);
  split(e);
  h.erase(h.lower_bound(b), h.lower_bound(e));
  h.emplace(b, Segment{e, op, {}});
  coalesce(b, e);
}

void record_read(const std::shared_ptr<Operation>& op, uintptr_t b, uintptr_t e) {
  auto& h = history();
  split(b);
  split(e);
  uintptr_t at = b;
  auto it = h.lower_bound(b);
  while (at < e) {
    if (it == h.end() || it->first > at) {  // a gap: bytes nothing tracked wrote
      const uintptr_t end = it == h.end() ? e : std::min(e, it->first);
      it = h.emplace_hint(it, at, Segment{end, nullptr, {op}});
      at = end;
      ++it;
      continue;
    }
    auto& readers = it->second.readers;
    auto same = std::find_if(readers.begin(), readers.end(), [&](const auto& r) { return r->stream == op->stream; });
    if (same == readers.end())
      readers.push_back(op);
    else
      *same = op;
    at = it->second.end;
    ++it;
  }
  coalesce(b, e);
}

void add(std::vector<Range>& v, uintptr_t b, uintptr_t e) {
  if (!v.empty() && b <= v.back().second && e >= v.back().first) {  // extends the last one: most accesses do
    v.back().first = std::min(v.back().first, b);
    v.back().second = std::max(v.back().second, e);
    return;
  }
  v.emplace_back(b, e);
}

}  // namespace

bool ordered(const Operation& a, const Operation& b) {
  if (a.stream == b.stream) return a.seq <= b.seq;
  const VectorClock& c = *b.seen;
  return static_cast<size_t>(a.stream) < c.size() && c[a.stream] >= a.seq;
}

void note_access(const void* p, size_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (!n || !tracked(a)) return;
  if (t_operation) return add(write ? t_operation->writes : t_operation->reads, a, a + n);
  std::shared_ptr<Operation> host = host_operation();
  add(write ? host->writes : host->reads, a, a + n);
  settle(host);
}

bool ordered_so_far() {
  Operation& op = *t_operation;
  normalise(op.reads);
  normalise(op.writes);
  for (const Range& r : op.writes)
    if (!check(op, r.first, r.second, true)) return false;
  for (const Range& r : op.reads)
    if (!check(op, r.first, r.second, false)) return false;
  return true;
}

void settle(const std::shared_ptr<Operation>& op) {
  if (op->reads.empty() && op->writes.empty()) return;
  Operation* outer = std::exchange(t_operation, op.get());
  const bool ordered = ordered_so_far();
  t_operation = outer;
  if (!ordered) return;
  for (const Range& r : op->writes) record_write(op, r.first, r.second);
  for (const Range& r : op->reads) record_read(op, r.first, r.second);
  op->reads = {};
  op->writes = {};
}

void forget_order(uintptr_t begin, size_t bytes) {
  release_owned_pinned(begin, begin + bytes, nullptr);
  auto& h = history();
  split(begin);
  split(begin + bytes);
  h.erase(h.lower_bound(begin), h.lower_bound(begin + bytes));
}

}  // namespace yuan::emu
