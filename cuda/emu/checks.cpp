// The access checks. The .cu files are compiled with -fsanitize=thread, which makes the compiler call
// __tsan_readN / __tsan_writeN before every load and store that might touch shared state; this file defines those
// hooks (ThreadSanitizer's runtime is never linked) and classifies each access by address:
//   device arena   bounds and use after free (shadow byte kNoAccess), uninitialised reads, natural alignment;
//                  from host code, an access is itself the error (a GPU's memory is not the host's);
//   shared memory  a kernel thread's access of its block's dynamic shared memory or of a __shared__ array: bounds,
//                  uninitialised reads, and races between barriers (per byte: the last writer, the readers since
//                  the last barrier, and whether a warp collective synchronised the two lanes since);
//   anything else  from a kernel, only its own stack, its parameters, pinned host memory and the program's static
//                  data are legal; heap or host stack memory means a host pointer reached the kernel.
// Host code touching host memory returns after two comparisons.
#include <sys/mman.h>

#include <cstring>
#include <type_traits>

#include "emulator.h"

extern "C" char __executable_start[];  // the program image: static data, __device__ variables, string literals
extern "C" char _end[];

namespace yuan::emu {

thread_local const ThreadSite* t_running = nullptr;

namespace {

constexpr size_t kDynamicWindow = 256 << 10;  // the dynamic shared memory buffer: the largest opt-in (227 KiB) and more
constexpr int16_t kSeveral = -2;  // Cell::reader when more than one thread read

// The race and initialisation state of one byte of shared memory. Epochs number the intervals between barriers
// of all blocks (a new block starts a new one), so that nothing needs clearing between them.
struct Cell {
  uint32_t written;      // epoch of the last write; bytes written before the running block's first epoch are garbage
  uint32_t read_epoch;   // epoch of `reader`'s read
  uint32_t write_seq;    // the writer's warp's collective count at the write
  uint32_t read_seq;     // the first reader's warp's collective count at its read
  int16_t writer;        // thread of the last write
  int16_t reader;        // thread that read in read_epoch, or kSeveral
  int16_t reader_warp;   // the readers' warp, or -1 when they come from several
};

struct Shared {
  unsigned char* dynamic = nullptr;  // kDynamicWindow bytes
  Cell* dynamic_cells = nullptr;
  Cell* section_cells = nullptr;
  uintptr_t section_begin = 0, section_end = 0;
  size_t dynamic_bytes = 0;  // the running launch's
  uint32_t epoch = 1, block_epoch = 1;
  HostWindows windows;
  SharedArray last_array;  // the array of the last static shared access: most accesses hit the same one
  Shared() {
    const size_t section = shared_section_end() - shared_section_begin();
    dynamic = static_cast<unsigned char*>(map(kDynamicWindow));
    dynamic_cells = static_cast<Cell*>(map(kDynamicWindow * sizeof(Cell)));
    section_cells = section ? static_cast<Cell*>(map(section * sizeof(Cell))) : nullptr;
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

std::string thread_name(int tid) {
  const uint3 t = thread_index(tid);
  return format("thread (%u,%u,%u)", t.x, t.y, t.z);
}

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

void device_access(uintptr_t a, size_t n, bool write, bool natural, const void* pc) {
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
    const bool ok = write ? sh[i] != kNoAccess : sh[i] == kInitialised;
    if (!ok) {
      const bool freed = [&] {
        const Allocation* al = allocation_near(a + i);
        return al && !al->live && a + i < al->begin + al->bytes;
      }();
      const Check c = sh[i] == kUninitialised ? Check::Uninitialised : freed ? Check::UseAfterFree : Check::OutOfBounds;
      fail(c, a + i, describe_device(a + i, n - i, write, sh[i]), pc);
    }
  }
  if (write) std::memset(sh, kInitialised, n);
}

// Whether a warp collective of the running thread's warp synchronised it with `other` since `seq`.
bool synced(int other, uint32_t seq) {
  const ThreadSite* me = t_running;
  const int warp = other / 32;
  return warp == me->warp && warp_synced(warp, seq, (1u << (other % 32)) | (1u << me->lane));
}

// Where a shared byte is, for a report: "dynamic shared memory at offset 12", "shared array f::part at offset 4".
struct SharedPlace {
  const char* array;  // null: dynamic shared memory
  uintptr_t base;
  std::string name(uintptr_t a) const {
    return array ? format("shared array %s at offset %zu", array, a - base)
                 : format("dynamic shared memory at offset %zu", a - base);
  }
};

// One byte of shared memory.
void shared_byte(Cell& c, uintptr_t a, bool write, const SharedPlace& place, const void* pc) {
  Shared& s = shared();
  const ThreadSite* me = t_running;
  const int16_t tid = static_cast<int16_t>(me->tid);
  if (!write && c.written < s.block_epoch)
    fail(Check::Uninitialised, a, format("read of %s, which no thread of this block wrote", place.name(a).c_str()),
         pc);
  if (c.written == s.epoch && c.writer != tid && !synced(c.writer, c.write_seq))
    fail(Check::SharedRace, a, format("%s of %s, which %s wrote since the last barrier", verb(write),
                                      place.name(a).c_str(), thread_name(c.writer).c_str()),
         pc);
  if (write && c.read_epoch == s.epoch && c.reader != tid) {
    const bool ok = c.reader == kSeveral ? c.reader_warp == me->warp && warp_synced(me->warp, c.read_seq, ~0u)
                                          : synced(c.reader, c.read_seq);
    if (!ok)
      fail(Check::SharedRace, a, format("write of %s, which %s read since the last barrier", place.name(a).c_str(),
                                        c.reader == kSeveral ? "other threads" : thread_name(c.reader).c_str()),
           pc);
  }
  if (write) {
    c.written = s.epoch;
    c.writer = tid;
    c.write_seq = warp_sync_count(me->warp);
  } else if (c.read_epoch != s.epoch) {
    c.read_epoch = s.epoch;
    c.reader = tid;
    c.reader_warp = static_cast<int16_t>(me->warp);
    c.read_seq = warp_sync_count(me->warp);
  } else if (c.reader != tid) {
    c.reader = kSeveral;
    if (c.reader_warp != me->warp) c.reader_warp = -1;
  }
}

// A kernel thread's access of shared memory; false when p is not shared memory.
bool shared_access(uintptr_t a, size_t n, bool write, bool natural, bool atomic, const void* pc) {
  Shared& s = shared();
  Cell* cells;
  SharedPlace place{nullptr, reinterpret_cast<uintptr_t>(s.dynamic)};
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
    place = SharedPlace{arr.name, arr.begin};
  } else {
    return false;
  }
  if (natural && (a & (n - 1)) != 0)
    fail(Check::Misaligned, a, format("%zu-byte %s of shared memory at 0x%zx, not a multiple of %zu", n, verb(write),
                                      a, n),
         pc);
  for (size_t i = 0; i < n; i++) {
    Cell& c = cells[i];
    if (atomic) {  // atomics do not race with each other; they read what is there, so it must be initialised
      if (c.written < s.block_epoch)
        fail(Check::Uninitialised, a + i, "atomic on " + place.name(a + i) + ", which no thread of this block wrote",
             pc);
      c.written = s.epoch;
      c.writer = static_cast<int16_t>(t_running->tid);
      c.write_seq = warp_sync_count(t_running->warp);
      continue;
    }
    shared_byte(c, a + i, write, place, pc);
  }
  return true;
}

void on_access(const void* p, size_t n, bool write, bool natural, const void* pc) {
  static const uintptr_t device = arenas().device;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a - device < kArenaBytes) return device_access(a, n, write, natural, pc);
  if (!t_running) return;  // host code, host memory
  const HostWindows& w = shared().windows;
  if (a - w.stacks_begin < w.stacks_end - w.stacks_begin) return;  // the thread's own variables
  if (shared_access(a, n, write, natural, false, pc)) return;
  if (a - w.params_begin < w.params_end - w.params_begin) return;
  if (a >= reinterpret_cast<uintptr_t>(__executable_start) && a < reinterpret_cast<uintptr_t>(_end)) return;
  if (in_arena(Space::Pinned, a)) {
    const std::string bad = check_range(Space::Pinned, p, n, false);
    if (!bad.empty()) fail(Check::OutOfBounds, a, format("%zu-byte %s: %s", n, verb(write), bad.c_str()), pc);
    return;
  }
  fail(Check::HostMemory, a, format("%zu-byte %s of host memory at %p, which is neither device, pinned nor shared "
                                    "memory (a host pointer passed to the kernel?)",
                                    n, verb(write), p),
       pc);
}

}  // namespace

void check_shared(uintptr_t p, size_t n, bool write, int tid) {
  // ldmatrix reads on behalf of the lane that gave the address: the checks run as that lane.
  const ThreadSite* self = t_running;
  const ThreadSite as{tid, tid / 32, tid % 32};
  t_running = &as;
  if (!shared_access(p, n, write, true, false, __builtin_return_address(0)))
    fail(Check::OutOfBounds, p, format("ldmatrix row address 0x%zx is not in shared memory", p),
         __builtin_return_address(0));
  t_running = self;
}

unsigned char* begin_block_shared(size_t dynamic_bytes) {
  Shared& s = shared();
  s.dynamic_bytes = dynamic_bytes;
  s.block_epoch = ++s.epoch;
  std::memset(s.dynamic, 0xff, dynamic_bytes);  // garbage, as a GPU leaves it: NaN in every float type
  return s.dynamic;
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
  if (in_arena(Space::Device, a)) {
    device_access(a, n, false, true, pc);
    device_access(a, n, true, true, pc);
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
