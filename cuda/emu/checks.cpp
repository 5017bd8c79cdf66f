// The access checks. The .cu files are compiled with -fsanitize=thread, which makes the compiler call
// __tsan_readN / __tsan_writeN before every load and store that might touch shared state; this file defines those
// hooks (ThreadSanitizer's runtime is never linked) and classifies each access by address:
//   device arena   bounds and use after free (shadow byte kNoAccess), uninitialised reads, natural alignment;
//                  from host code, an access is itself the error (a GPU's memory is not the host's); races between
//                  the threads of a launch (below);
//   shared memory  a kernel thread's access of its block's dynamic shared memory or of a __shared__ array: bounds,
//                  uninitialised reads, and races between barriers;
//   anything else  from a kernel, only its own stack, its parameters, pinned host memory and the program's static
//                  data are legal; heap or host stack memory means a host pointer reached the kernel.
// Host code touching host memory returns after two comparisons.
// Races: every byte of shared and device memory has a Cell with the last write and the reads since, each with its
// thread, epoch and code address. Two accesses of one byte, one of them a write, race unless the same thread made
// them, a barrier of their block separates them, or a warp collective of both lanes came between them. Epochs number
// the intervals between barriers of all blocks of all launches, so a cell's epochs say whether an access was this
// block's, an earlier block's of this launch (nothing orders blocks: always a race on device memory) or older.
// Typed accesses are also checked at their type's alignment (-fsanitize=alignment, hook at the end), which sees a
// 16-byte pack read as one access even when the optimiser splits it into element loads.
// A launch that asks for its traffic (traffic.cpp) has each access of device and shared memory counted once checked;
// the cells say which device bytes it reads or writes for the first time.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "emulator.h"

extern "C" char __executable_start[];  // the program image: static data, __device__ variables, string literals
extern "C" char _end[];

namespace yuan::emu {

thread_local const ThreadSite* t_running = nullptr;

namespace {

// Device bytes a launch journals at most (10 bytes each): a launch that writes more is not run twice.
constexpr size_t kJournalBytes = 32 << 20;
constexpr size_t kDynamicWindow = 256 << 10;  // the dynamic shared memory buffer: the largest opt-in (227 KiB) and more
// Cell::reader beyond a thread index: several threads of warp w (kWarpReaders | w), of several warps of one block,
// or of several blocks.
constexpr uint16_t kWarpReaders = 0x8000, kSeveral = 0xfffe, kBlocks = 0xffff;

// The race and initialisation state of one byte of shared or device memory. Nothing needs clearing between blocks
// or launches: an epoch before the running block's or launch's first is simply old.
struct Cell {
  uint32_t written;            // epoch of the last write; shared bytes written before the block's first are garbage
  uint32_t read;               // epoch of the latest read
  uint32_t write_seq;          // the writer's warp's collective count at the write
  uint32_t read_seq;           // the first reader's (of `read`) warp's collective count at its read
  uint32_t write_pc, read_pc;  // the code that made them, as offsets into the program image
  uint16_t writer;             // thread (in its block) of the last write
  uint16_t reader;             // thread of the reads in `read`, or kWarpReaders | warp, kSeveral, kBlocks
};

struct Shared {
  unsigned char* dynamic = nullptr;  // kDynamicWindow bytes
  Cell* dynamic_cells = nullptr;
  Cell* section_cells = nullptr;
  Cell* device_cells = nullptr;  // device_cells[p - device arena] is device byte p's
  uintptr_t section_begin = 0, section_end = 0;
  size_t dynamic_bytes = 0;  // the running launch's
  uint32_t epoch = 1, block_epoch = 1, launch_epoch = 1;
  std::vector<std::pair<uint32_t, uint3>> blocks;  // the running launch's blocks so far: first epoch, index
  bool journaling = false, atomics_used = false;  // of the running launch
  Journal journal;
  HostWindows windows;
  SharedArray last_array;  // the array of the last static shared access: most accesses hit the same one
  Shared() {
    const size_t section = shared_section_end() - shared_section_begin();
    dynamic = static_cast<unsigned char*>(map(kDynamicWindow));
    dynamic_cells = static_cast<Cell*>(map(kDynamicWindow * sizeof(Cell)));
    section_cells = section ? static_cast<Cell*>(map(section * sizeof(Cell))) : nullptr;
    device_cells = static_cast<Cell*>(map(kArenaBytes * sizeof(Cell)));
    section_begin = shared_section_begin();
    section_end = shared_section_end();
  }
  static void* map(size_t bytes) {  // zero pages on demand: untouched cells read as never written
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    return p;
  }
};

Shared& shared() {
  static Shared* s = new Shared;
  return *s;
}

cudaError_t error_of(Check c) {
  switch (c) {
    case Check::OutOfBounds: case Check::UseAfterFree: case Check::HostMemory: return cudaErrorIllegalAddress;
    case Check::Misaligned: return cudaErrorMisalignedAddress;
    default: return cudaErrorLaunchFailure;
  }
}

// A failed check: inside a kernel the launch ends here; in host code it is reported (once while the error is
// pending, so that a loop over device memory does not print a line per element) and the access goes ahead.
void fail(Check c, uintptr_t a, const std::string& what, const void* pc) {
  // A kernel runs inside an API call, which holds the lock; kernel_fault leaves the thread's stack for good, so
  // nothing on it may hold the lock.
  if (t_running) kernel_fault(c, a, what + " (in " + function_name(pc) + ")");
  Lock lock(mutex());
  if (sticky_error() == cudaSuccess) report(c, Where{}, a, what + " (in " + function_name(pc) + ")", true, error_of(c));
}

const char* verb(bool write) { return write ? "write" : "read"; }

// Thread `tid` of the block that ran at `epoch`: the running one, or an earlier block of the launch.
std::string thread_name(int tid, uint32_t epoch) {
  const Shared& s = shared();
  const uint3 t = thread_index(tid);
  std::string name = format("thread (%u,%u,%u)", t.x, t.y, t.z);
  if (epoch >= s.block_epoch) return name;
  auto it = std::upper_bound(s.blocks.begin(), s.blocks.end(), epoch,
                             [](uint32_t e, const std::pair<uint32_t, uint3>& b) { return e < b.first; });
  if (it == s.blocks.begin()) return name;
  const uint3 b = std::prev(it)->second;
  return name + format(" of block (%u,%u,%u)", b.x, b.y, b.z);
}

uint32_t code_offset(const void* pc) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(__executable_start));
}
std::string code_at(uint32_t offset) { return function_name(__executable_start + offset); }

// Which allocation an address outside every live byte belongs to, in words.
std::string describe_device(uintptr_t a, size_t n, bool write, uint8_t state) {
  std::string head = format("%zu-byte %s of device memory at 0x%zx", n, verb(write), a);
  const Allocation* al = allocation_near(a);
  if (state == kUninitialised)
    return head + format(": byte %zu of a %zu-byte allocation at 0x%zx was never written", a - al->begin, al->bytes,
                         al->begin);
  if (al && !al->live && a < al->begin + al->bytes)
    return head + format(", in a %zu-byte allocation at 0x%zx that was freed", al->bytes, al->begin);
  std::string where = head + ": in no allocation";
  if (al && a >= al->begin + al->bytes)
    where = head + format(": %zu bytes past the end of a %zu-byte%s allocation at 0x%zx", a - (al->begin + al->bytes),
                          al->bytes, al->live ? "" : " (freed)", al->begin);
  const Allocation* next = allocation_near(a + (size_t(1) << 20));  // a following allocation within 1 MiB
  if (next && next->begin > a && (!al || next->begin - a < a - (al->begin + al->bytes)))
    where = head + format(": %zu bytes before a %zu-byte allocation at 0x%zx", next->begin - a, next->bytes,
                          next->begin);
  return where;
}

// Whether a warp collective of the running thread's warp synchronised it with `other` since `seq`.
bool synced(int other, uint32_t seq) {
  const ThreadSite* me = t_running;
  const int warp = other / 32;
  return warp == me->warp && warp_synced(warp, seq, (1u << (other % 32)) | (1u << me->lane));
}

// Where a byte is, for a report: "dynamic shared memory at offset 12", "shared array f::part at offset 4",
// "device memory at 0x7f0000001000".
struct Place {
  enum Kind { Dynamic, Array, Device } kind;
  const char* array;  // Array's name
  uintptr_t base;
  std::string name(uintptr_t a) const {
    if (kind == Device) return format("device memory at 0x%zx", a);
    return kind == Array ? format("shared array %s at offset %zu", array, a - base)
                         : format("dynamic shared memory at offset %zu", a - base);
  }
};

// The running thread's access, as the race check of each of its bytes needs it. Accesses from epoch `first` on may
// race with it: its block's for shared memory, its launch's for device memory.
struct Access {
  bool write;
  uint32_t first, now, block;  // epochs
  uint16_t tid;
  int warp;
  uint32_t seq, pc;  // its warp's collective count, its code
  const void* code;
  Access(bool w, uint32_t first_epoch, const void* at) : write(w), first(first_epoch), code(at) {
    const Shared& s = shared();
    now = s.epoch;
    block = s.block_epoch;
    tid = static_cast<uint16_t>(t_running->tid);
    warp = t_running->warp;
    seq = warp_sync_count(warp);
    pc = code_offset(at);
  }
};

// The race check of one byte, then the access recorded in its cell.
void race_byte(Cell& c, uintptr_t a, const Access& x, const Place& place) {
  const bool own_write = c.written < x.first || (c.written >= x.block && c.writer == x.tid);
  if (!x.write && c.read == x.now && c.reader == x.tid && own_write)
    return;  // a read the thread made before, of nothing another thread wrote: the most common case
  const Check race = place.kind == Place::Device ? Check::GlobalRace : Check::SharedRace;
  const char* since = place.kind == Place::Device ? "in this launch" : "since the last barrier";
  const bool ordered_write =
      own_write || (c.written >= x.block && (c.written < x.now || synced(c.writer, c.write_seq)));
  if (!ordered_write)
    fail(race, a, format("%s of %s, which %s wrote %s (its write in %s)", verb(x.write), place.name(a).c_str(),
                         thread_name(c.writer, c.written).c_str(), since, code_at(c.write_pc).c_str()),
         x.code);
  if (x.write) {
    if (c.read >= x.first) {
      bool ordered;
      if (c.reader == kBlocks || c.read < x.block) ordered = false;
      else if (c.read < x.now || c.reader == x.tid) ordered = true;
      else if (c.reader < kWarpReaders) ordered = synced(c.reader, c.read_seq);
      else if (c.reader != kSeveral)
        ordered = (c.reader & ~kWarpReaders) == x.warp && warp_synced(x.warp, c.read_seq, ~0u);
      else ordered = false;
      if (!ordered) {
        const std::string readers = c.reader == kBlocks       ? std::string("threads of other blocks")
                                    : c.reader >= kWarpReaders ? std::string("other threads")
                                                               : thread_name(c.reader, c.read);
        fail(race, a, format("write of %s, which %s read %s (a read in %s)", place.name(a).c_str(), readers.c_str(),
                             since, code_at(c.read_pc).c_str()),
             x.code);
      }
    }
    c.written = x.now;
    c.writer = x.tid;
    c.write_seq = x.seq;
    c.write_pc = x.pc;
    return;
  }
  if (c.read >= x.first && c.reader == kBlocks) {
    c.read = x.now;
  } else if (c.read >= x.first && c.read < x.block) {  // another block of the launch read it too
    c.read = x.now;
    c.reader = kBlocks;
  } else if (c.read < x.now) {  // the first read since the last barrier
    c.read = x.now;
    c.reader = x.tid;
    c.read_seq = x.seq;
    c.read_pc = x.pc;
  } else if (c.reader != x.tid && c.reader != kSeveral) {
    const int warp = c.reader < kWarpReaders ? c.reader / 32 : c.reader & ~kWarpReaders;
    c.reader = warp == x.warp ? static_cast<uint16_t>(kWarpReaders | warp) : kSeveral;
  }
}

// Runs `one(i)`, the checks and update of byte i's cell, for each byte of an access. A byte whose cell was the same
// as the first byte's takes the first byte's outcome (the same checks pass on the same state, and the update is
// the same): the bytes of an access were mostly last touched together.
template <typename F>
void each_byte(Cell* cells, size_t n, F one) {
  const Cell first = cells[0];
  one(0);
  for (size_t i = 1; i < n; i++) {
    if (std::memcmp(&cells[i], &first, sizeof(Cell)) == 0)
      cells[i] = cells[0];
    else
      one(i);
  }
}

void device_access(uintptr_t a, size_t n, bool write, bool natural, bool atomic, const void* pc) {
  const Arenas& ar = arenas();
  if (!t_running) {
    fail(Check::HostMemory, a, format("host code %ss %zu bytes of device memory at 0x%zx", verb(write), n, a), pc);
    return;
  }
  if (natural && (a & (n - 1)) != 0) {
    fail(Check::Misaligned, a, format("%zu-byte %s of device memory at 0x%zx, not a multiple of %zu", n, verb(write),
                                      a, n),
         pc);
  }
  uint8_t* sh = ar.shadow + (a - ar.device);
  for (size_t i = 0; i < n; i++) {
    const bool ok = write && !atomic ? sh[i] != kNoAccess : sh[i] == kInitialised;
    if (!ok) {
      const bool freed = [&] {
        const Allocation* al = allocation_near(a + i);
        return al && !al->live && a + i < al->begin + al->bytes;
      }();
      const Check c = sh[i] == kUninitialised ? Check::Uninitialised : freed ? Check::UseAfterFree : Check::OutOfBounds;
      fail(c, a + i, describe_device(a + i, n - i, write && !atomic, sh[i]), pc);
    }
  }
  Shared& s = shared();
  Cell* cells = s.device_cells + (a - ar.device);
  const Access x(write, s.launch_epoch, pc);
  if (counter) {  // before the cells record this access (each_byte updates some of them wholesale)
    uint64_t read = 0, written = 0;
    for (size_t i = 0; i < n; i++) {
      const bool wrote = cells[i].written >= x.first;  // a read of what the launch wrote fetches nothing new
      read += (!write || atomic) && !wrote && cells[i].read < x.first;
      written += write && !wrote;
    }
    count_first_touches(*counter, read, written);
    count_access(*counter, a, n, true, pc);
  }
  if (write && s.journaling) {  // what the launch overwrites first, so that it can run again (kernel.cpp)
    Journal& j = s.journal;
    if (j.at.size() + n > kJournalBytes) {
      s.journaling = false;
      j.complete = false;
    }
    for (size_t i = 0; i < n && s.journaling; i++)
      if (cells[i].written < x.first) {
        j.at.push_back(a + i);
        j.before.push_back(reinterpret_cast<const uint8_t*>(a)[i]);
        j.state.push_back(sh[i]);
      }
  }
  // For the happens-before check between operations (order.cpp): the bytes the launch reads or writes for the first
  // time, before the cells record this access. Later accesses of a byte add nothing to what the launch touched.
  bool fresh_write = false, fresh_read = false;
  for (size_t i = 0; i < n; i++) {
    const bool unwritten = cells[i].written < x.first;
    fresh_write |= write && unwritten;
    fresh_read |= (!write || atomic) && unwritten && cells[i].read < x.first;
  }
  if (fresh_write) note_access(reinterpret_cast<const void*>(a), n, true);
  if (fresh_read) note_access(reinterpret_cast<const void*>(a), n, false);
  if (write) std::memset(sh, kInitialised, n);
  if (atomic) {  // atomics do not race with each other; a plain access of the byte is checked against them
    for (size_t i = 0; i < n; i++) {
      cells[i].written = x.now;
      cells[i].writer = x.tid;
      cells[i].write_seq = x.seq;
      cells[i].write_pc = x.pc;
    }
    return;
  }
  const Place place{Place::Device, nullptr, 0};
  each_byte(cells, n, [&](size_t i) { race_byte(cells[i], a + i, x, place); });
}

// A kernel thread's access of shared memory; false when p is not shared memory.
bool shared_access(uintptr_t a, size_t n, bool write, bool natural, bool atomic, const void* pc) {
  Shared& s = shared();
  Cell* cells;
  Place place{Place::Dynamic, nullptr, reinterpret_cast<uintptr_t>(s.dynamic)};
  if (a - place.base < kDynamicWindow) {
    const size_t off = a - place.base;
    if (off + n > s.dynamic_bytes)
      fail(Check::OutOfBounds, a, format("%zu-byte %s at offset %zu of dynamic shared memory, which is %zu bytes", n,
                                         verb(write), off, s.dynamic_bytes),
           pc);
    cells = s.dynamic_cells + off;
  } else if (a - s.section_begin < s.section_end - s.section_begin) {
    SharedArray& arr = s.last_array;
    if (a - arr.begin >= arr.bytes && !shared_array(a, &arr)) {
      // Arrays sit 64 KiB apart (cuda_runtime.h), so the one whose slot this is overran into its gap.
      SharedArray before;
      const bool found = shared_array(a - (a - s.section_begin) % 65536, &before);
      fail(Check::OutOfBounds, a,
           found ? format("%zu-byte %s %zu bytes past the end of shared array %s (%zu bytes)", n, verb(write),
                          a - (before.begin + before.bytes), before.name, before.bytes)
                 : format("%zu-byte %s at 0x%zx, in no shared array", n, verb(write), a),
           pc);
    }
    if (a + n > arr.begin + arr.bytes)
      fail(Check::OutOfBounds, a, format("%zu-byte %s at offset %zu of shared array %s, which is %zu bytes", n,
                                         verb(write), a - arr.begin, arr.name, arr.bytes),
           pc);
    cells = s.section_cells + (a - s.section_begin);
    place = Place{Place::Array, arr.name, arr.begin};
  } else {
    return false;
  }
  if (natural && (a & (n - 1)) != 0)
    fail(Check::Misaligned, a, format("%zu-byte %s of shared memory at 0x%zx, not a multiple of %zu", n, verb(write),
                                      a, n),
         pc);
  const Access x(write, s.block_epoch, pc);
  if (counter) count_access(*counter, a, n, false, pc);
  each_byte(cells, n, [&](size_t i) {
    Cell& c = cells[i];
    if (!write || atomic) {  // atomics read what is there too
      if (c.written < s.block_epoch)
        fail(Check::Uninitialised, a + i, format("%s %s, which no thread of this block wrote",
                                                 atomic ? "atomic on" : "read of", place.name(a + i).c_str()),
             pc);
    }
    if (atomic) {  // atomics do not race with each other; a plain access of the byte is checked against them
      c.written = x.now;
      c.writer = x.tid;
      c.write_seq = x.seq;
      c.write_pc = x.pc;
      return;
    }
    race_byte(c, a + i, x, place);
  });
  return true;
}

void on_access(const void* p, size_t n, bool write, bool natural, const void* pc) {
  static const uintptr_t device = arenas().device;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (t_running) maybe_switch();
  if (a - device < kArenaBytes) return device_access(a, n, write, natural, false, pc);
  if (!t_running) return;  // host code, host memory
  const HostWindows& w = shared().windows;
  if (a - w.stacks_begin < w.stacks_end - w.stacks_begin) return;  // the thread's own variables
  if (shared_access(a, n, write, natural, false, pc)) return;
  if (a - w.params_begin < w.params_end - w.params_begin) return;
  if (a >= reinterpret_cast<uintptr_t>(__executable_start) && a < reinterpret_cast<uintptr_t>(_end)) return;
  if (in_arena(Space::Pinned, a)) {
    const std::string bad = check_range(Space::Pinned, p, n, false);
    if (!bad.empty()) fail(Check::OutOfBounds, a, format("%zu-byte %s: %s", n, verb(write), bad.c_str()), pc);
    note_access(p, n, write);  // pinned memory has no race cells: every access goes to the launch's ranges
    return;
  }
  fail(Check::HostMemory, a, format("%zu-byte %s of host memory at %p, which is neither device, pinned nor shared "
                                    "memory (a host pointer passed to the kernel?)",
                                    n, verb(write), p),
       pc);
}

}  // namespace

void check_shared(uintptr_t p, size_t n, bool write, int tid, const void* pc) {
  // ldmatrix reads on behalf of the lane that gave the address: the checks run as that lane.
  const ThreadSite* self = t_running;
  const ThreadSite as{tid, tid / 32, tid % 32};
  t_running = &as;
  if (!shared_access(p, n, write, true, false, pc))
    fail(Check::OutOfBounds, p, format("ldmatrix row address 0x%zx is not in shared memory", p), pc);
  t_running = self;
}

void load_vector(void* out, const void* p, size_t bytes) {
  on_access(p, bytes, false, true, __builtin_return_address(0));
  std::memcpy(out, p, bytes);
}

void store_vector(void* p, const void* in, size_t bytes) {
  on_access(p, bytes, true, true, __builtin_return_address(0));
  std::memcpy(p, in, bytes);
}

void begin_launch(bool journal) {
  Shared& s = shared();
  s.launch_epoch = ++s.epoch;
  s.blocks.clear();
  s.journaling = journal;
  s.atomics_used = false;
  s.journal = Journal{};
}

bool launch_used_atomics() { return shared().atomics_used; }

Journal take_journal() {
  Shared& s = shared();
  s.journaling = false;
  return std::exchange(s.journal, Journal{});
}

void undo(const Journal& j) {
  const Arenas& ar = arenas();
  for (size_t i = 0; i < j.at.size(); i++) {
    *reinterpret_cast<uint8_t*>(j.at[i]) = j.before[i];
    ar.shadow[j.at[i] - ar.device] = j.state[i];
  }
}

unsigned char* begin_block_shared(size_t dynamic_bytes, uint3 block) {
  Shared& s = shared();
  s.dynamic_bytes = dynamic_bytes;
  s.block_epoch = ++s.epoch;
  s.blocks.emplace_back(s.block_epoch, block);
  // Garbage, as a GPU leaves it: NaN in every float type, never the values an earlier block left.
  std::memset(s.dynamic, 0xff, dynamic_bytes);
  for (const SharedArray& arr : shared_arrays()) std::memset(reinterpret_cast<void*>(arr.begin), 0xff, arr.bytes);
  return s.dynamic;
}

void forget_device(uintptr_t begin, size_t bytes) {
  const uintptr_t page = 4096;
  const uintptr_t from = reinterpret_cast<uintptr_t>(shared().device_cells + (begin - arenas().device));
  const uintptr_t to = from + bytes * sizeof(Cell);
  const uintptr_t first = (from + page - 1) & ~(page - 1), last = to & ~(page - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void barrier_shared() { ++shared().epoch; }

void set_host_windows(const HostWindows& w) { shared().windows = w; }

uint64_t atomic(void* p, AtomicType t, AtomicOp op, uint64_t operand, uint64_t compare) {
  const size_t n = t == AtomicType::U64 || t == AtomicType::F64 ? 8 : 4;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const void* pc = __builtin_return_address(0);
  if (!t_running) {
    fail(Check::HostMemory, a, "an atomic called outside a kernel", pc);
    return 0;
  }
  maybe_switch();
  shared().atomics_used = true;
  if (in_arena(Space::Device, a)) {
    device_access(a, n, true, true, true, pc);
  } else if (!shared_access(a, n, true, true, true, pc)) {
    on_access(p, n, true, true, pc);
  }
  uint64_t old = 0;
  std::memcpy(&old, p, n);
  auto apply = [&](auto cur, auto v, auto cmp) -> decltype(cur) {
    if constexpr (std::is_integral_v<decltype(cur)>) {  // bitwise atomics exist for integers only (cuda_runtime.h)
      if (op == AtomicOp::And) return cur & v;
      if (op == AtomicOp::Or) return cur | v;
      if (op == AtomicOp::Xor) return cur ^ v;
    }
    switch (op) {
      case AtomicOp::Add: return cur + v;
      case AtomicOp::Sub: return cur - v;
      case AtomicOp::Min: return v < cur ? v : cur;
      case AtomicOp::Max: return v > cur ? v : cur;
      case AtomicOp::Exch: return v;
      case AtomicOp::Cas: return cur == cmp ? v : cur;
      default: return cur;
    }
  };
  auto typed = [&](auto zero) {
    using T = decltype(zero);
    T cur, v, cmp;
    std::memcpy(&cur, &old, sizeof(T));
    std::memcpy(&v, &operand, sizeof(T));
    std::memcpy(&cmp, &compare, sizeof(T));
    const T next = apply(cur, v, cmp);
    std::memcpy(p, &next, sizeof(T));
  };
  switch (t) {
    case AtomicType::I32: typed(int32_t()); break;
    case AtomicType::U32: typed(uint32_t()); break;
    case AtomicType::U64: typed(uint64_t()); break;
    case AtomicType::F32: typed(float()); break;
    case AtomicType::F64: typed(double()); break;
  }
  return old;
}

}  // namespace yuan::emu

// ---- the instrumentation's entry points ----

extern "C" {

#define YUAN_EMU_ACCESS(n)                                                                                     \
  void __tsan_read##n(void* p) { yuan::emu::on_access(p, n, false, true, __builtin_return_address(0)); }     \
  void __tsan_write##n(void* p) { yuan::emu::on_access(p, n, true, true, __builtin_return_address(0)); }     \
  void __tsan_unaligned_read##n(void* p) { yuan::emu::on_access(p, n, false, false, __builtin_return_address(0)); } \
  void __tsan_unaligned_write##n(void* p) { yuan::emu::on_access(p, n, true, false, __builtin_return_address(0)); }
YUAN_EMU_ACCESS(1)
YUAN_EMU_ACCESS(2)
YUAN_EMU_ACCESS(4)
YUAN_EMU_ACCESS(8)
YUAN_EMU_ACCESS(16)
#undef YUAN_EMU_ACCESS

void __tsan_read_range(void* p, unsigned long n) {
  yuan::emu::on_access(p, n, false, false, __builtin_return_address(0));
}
void __tsan_write_range(void* p, unsigned long n) {
  yuan::emu::on_access(p, n, true, false, __builtin_return_address(0));
}

// -fsanitize=alignment's hook: a typed access (load, store, member access, reference binding) through a pointer
// that is not a multiple of its type's alignment. The compiler passes its data as UBSan's runtime defines it
// (TypeMismatchData, version 1). A GPU needs every access aligned to its width, and the vector types' alignment is
// their width (vector_types.h, cuda/common.cuh's packs): in a kernel this is the fault a GPU would take. Host code
// of .cu files is checked for what a GPU runs only.
struct UbsanSource {
  const char* file;
  uint32_t line, column;
};
struct UbsanType {
  uint16_t kind, info;
  char name[1];
};
struct UbsanTypeMismatch {
  UbsanSource at;
  const UbsanType* type;
  unsigned char log_alignment, check_kind;
};
void __ubsan_handle_type_mismatch_v1(UbsanTypeMismatch* d, uintptr_t p) {
  if (!yuan::emu::t_running) return;
  const size_t align = size_t(1) << d->log_alignment;
  yuan::emu::fail(yuan::emu::Check::Misaligned, p,
                  yuan::emu::format("access of %s at 0x%zx, not a multiple of %zu, its type's alignment (%s:%u)",
                                    d->type->name, p, align, d->at.file, d->at.line),
                  __builtin_return_address(0));
}

// Calls the instrumentation makes that have nothing to check here.
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

// Atomics of host code in instrumented files (reference counts, GoogleTest's bookkeeping): performed, sequentially
// consistent whatever order was asked (always a correct choice).
#define YUAN_EMU_ATOMICS(bits, T)                                                                              \
  T __tsan_atomic##bits##_load(const volatile T* p, int) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }        \
  void __tsan_atomic##bits##_store(volatile T* p, T v, int) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }        \
  T __tsan_atomic##bits##_exchange(volatile T* p, T v, int) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_fetch_add(volatile T* p, T v, int) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_fetch_sub(volatile T* p, T v, int) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_fetch_and(volatile T* p, T v, int) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_fetch_or(volatile T* p, T v, int) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }  \
  T __tsan_atomic##bits##_fetch_xor(volatile T* p, T v, int) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_fetch_nand(volatile T* p, T v, int) {                                               \
    return __atomic_fetch_nand(p, v, __ATOMIC_SEQ_CST);                                                       \
  }                                                                                                          \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* p, T* c, T v, int, int) {                     \
    return __atomic_compare_exchange_n(p, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                   \
  }                                                                                                          \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* p, T* c, T v, int, int) {                       \
    return __atomic_compare_exchange_n(p, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                   \
  }                                                                                                          \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T* p, T c, T v, int, int) {                           \
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                         \
    return c;                                                                                                \
  }
YUAN_EMU_ATOMICS(8, unsigned char)
YUAN_EMU_ATOMICS(16, unsigned short)
YUAN_EMU_ATOMICS(32, unsigned int)
YUAN_EMU_ATOMICS(64, unsigned long long)
#undef YUAN_EMU_ATOMICS

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

}  // extern "C"
