// Device and pinned memory of the emulator: two reserved address ranges (arenas), so that "is this device memory"
// is one comparison in the access hooks. Each allocation starts on a page and is followed by at least one page
// that no allocation owns; freed ranges are unmapped and never handed out again. Device memory has a shadow
// byte per byte (no access / uninitialised / initialised), which the access hooks and the API's copies read and
// write.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "emulator.h"

namespace yuan::emu {
namespace {

constexpr size_t kReserve = kArenaBytes;  // pages are committed as they are allocated
constexpr size_t kPage = 4096;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void* reserve(int prot) {
  void* p = mmap(nullptr, kReserve, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("cuda emulator: reserving address space");
    std::abort();
  }
  return p;
}

struct Arena {
  uintptr_t base = 0;
  size_t cursor = kPage;  // the first allocation has a free page before it too
};

struct Memory {
  Arena arena[2];
  // The shadow is readable from the start: untouched pages read as zero, kNoAccess.
  uint8_t* shadow = static_cast<uint8_t*>(reserve(PROT_READ | PROT_WRITE));
  std::map<uintptr_t, Allocation> allocations;  // by start, live and freed
  size_t device_in_use = 0;
  Memory() {
    for (Arena& a : arena) a.base = reinterpret_cast<uintptr_t>(reserve(PROT_NONE));
  }
};

Memory& memory() {
  static Memory* m = new Memory;  // never destroyed: kernels and frees may run during static destruction
  return *m;
}

uint8_t* device_shadow(uintptr_t p) { return memory().shadow + (p - memory().arena[0].base); }

}  // namespace

const Arenas& arenas() {
  static const Arenas a{memory().arena[0].base, memory().arena[1].base, memory().shadow};
  return a;
}

bool in_arena(Space s, uintptr_t p) { return p - memory().arena[static_cast<int>(s)].base < kReserve; }

size_t device_bytes_in_use() { return memory().device_in_use; }

size_t device_memory_bytes() {
  static const size_t bytes = [] {
    const char* mb = std::getenv("YUAN_EMU_DEVICE_MB");
    if (!mb || !*mb) return size_t(16) << 30;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(mb, &end, 10);
    if (*end || v == 0 || v > (kReserve >> 20)) {
      std::fprintf(stderr, "cuda emulator: YUAN_EMU_DEVICE_MB = '%s': expected a whole number of MiB, 1 to %zu\n", mb,
                   kReserve >> 20);
      std::exit(2);
    }
    return static_cast<size_t>(v) << 20;
  }();
  return bytes;
}

void* allocate(Space s, size_t bytes) {
  Memory& m = memory();
  if (s == Space::Device && bytes > device_memory_bytes() - m.device_in_use) return nullptr;
  Arena& a = m.arena[static_cast<int>(s)];
  const size_t span = round_up(bytes, kPage);
  if (a.cursor + span + kPage > kReserve) return nullptr;
  const uintptr_t begin = a.base + a.cursor;
  a.cursor += span + kPage;
  if (mprotect(reinterpret_cast<void*>(begin), span, PROT_READ | PROT_WRITE) != 0) return nullptr;
  if (s == Space::Device) {
    // Fresh device memory holds garbage on a GPU: a NaN pattern here, so that a result nobody wrote shows.
    std::memset(reinterpret_cast<void*>(begin), 0xff, bytes);
    std::memset(device_shadow(begin), kUninitialised, bytes);
    m.device_in_use += bytes;
  }
  m.allocations[begin] = Allocation{begin, bytes, s, true};
  return reinterpret_cast<void*>(begin);
}

bool release(Space s, void* p) {
  Memory& m = memory();
  const auto it = m.allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.allocations.end() || !it->second.live || it->second.space != s) return false;
  Allocation& a = it->second;
  a.live = false;
  const size_t span = round_up(a.bytes, kPage);
  if (s == Space::Device) {
    std::memset(device_shadow(a.begin), kNoAccess, a.bytes);
    forget_device(a.begin, a.bytes);
    m.device_in_use -= a.bytes;
  }
  forget_order(a.begin, a.bytes);
  // Host code that still reads the range through a stale pointer now faults instead of reading old data.
  madvise(p, span, MADV_DONTNEED);
  mprotect(p, span, PROT_NONE);
  return true;
}

const Allocation* allocation_near(uintptr_t p) {
  Memory& m = memory();
  auto it = m.allocations.upper_bound(p);
  if (it == m.allocations.begin()) return nullptr;
  return &std::prev(it)->second;
}

std::string check_range(Space s, const void* p, size_t n, bool check_init) {
  if (n == 0) return {};
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const char* space = s == Space::Device ? "device" : "pinned host";
  if (!in_arena(s, a)) return format("%p is not %s memory", p, space);
  const Allocation* al = allocation_near(a);
  if (!al || a >= al->begin + round_up(al->bytes, kPage) + kPage)
    return format("%p is in no %s allocation", p, space);
  if (!al->live)
    return format("%p is in a %zu-byte %s allocation at 0x%zx that was freed", p, al->bytes, space, al->begin);
  if (a + n > al->begin + al->bytes)
    return format("%zu bytes at %p end %zu bytes past the end of a %zu-byte %s allocation at 0x%zx", n, p,
                    a + n - (al->begin + al->bytes), al->bytes, space, al->begin);
  if (check_init && s == Space::Device) {
    const uint8_t* sh = device_shadow(a);
    for (size_t i = 0; i < n; i++)
      if (sh[i] != kInitialised)
        return format("byte %zu of the %zu bytes read at %p (offset %zu of a %zu-byte allocation) is uninitialised",
                        i, n, p, a + i - al->begin, al->bytes);
  }
  return {};
}

void mark_initialised(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (n && in_arena(Space::Device, a)) std::memset(device_shadow(a), kInitialised, n);
}

void copy_shadow(void* dst, const void* src, size_t n) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (!n || !in_arena(Space::Device, d)) return;
  if (in_arena(Space::Device, s))
    std::memmove(device_shadow(d), device_shadow(s), n);
  else
    std::memset(device_shadow(d), kInitialised, n);
}

}  // namespace yuan::emu
