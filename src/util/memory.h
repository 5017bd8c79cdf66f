// Host memory that knows what it is for. Every large host allocation goes through HostArray so that the
// memory plan, the step log and the tests (e.g. "optimizer bytes shrink as 1/N under ZeRO") read one
// account instead of guessing from RSS.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>

namespace yuan {

enum class Mem { Params, Grads, Optimizer, Activations, Data, Comm, kCount };
size_t mem_bytes(Mem m);       // live bytes in this category on this process
size_t host_peak_rss_bytes();  // VmHWM of this process
size_t host_rss_bytes();       // VmRSS of this process
const char* mem_name(Mem m);   // "optimizer", ... (for messages)
std::string format_bytes(double bytes);  // "1.50 GiB"

// The host memory this process's node can still give it: the smaller of /proc/meminfo's MemAvailable and the
// room left under the memory cgroup of this process (v2: memory.max - memory.current, v1: memory.limit_in_bytes -
// memory.usage_in_bytes, at each level up to the root; the cgroup's inactive file cache counts as free, because
// the kernel reclaims it before it kills), with the source of the figure for messages. The test hook
// YUANLM_NODE_MEMORY=BYTES (suffix K, M or G) replaces the reading. `root` prefixes /proc and /sys (tests).
struct NodeMemory {
  size_t available = SIZE_MAX;
  std::string source;  // "MemAvailable", "cgroup /slurm/job_1 (v2)", "YUANLM_NODE_MEMORY"
};
NodeMemory node_available_memory(const std::string& root = "");

namespace detail {
void mem_account(Mem m, std::ptrdiff_t delta);
// Throws the one-line Error "out of host memory: N GiB of <category> memory for <what> ..." (with the node's
// available memory), in place of std::bad_alloc.
[[noreturn]] void out_of_host_memory(size_t bytes, const char* what);
}  // namespace detail

// std::vector::resize (or any allocation in `f`) that reports what it was allocating instead of std::bad_alloc.
template <typename F>
void allocating(size_t bytes, const char* what, F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
    detail::out_of_host_memory(bytes, what);
  }
}

// 64-byte aligned, zero-initialised, move-only array.
template <typename T>
class HostArray {
 public:
  HostArray() = default;
  HostArray(size_t n, Mem cat) : n_(n), cat_(cat) {
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p_) detail::out_of_host_memory(bytes, mem_name(cat));
    for (size_t i = 0; i < n; i++) new (p_ + i) T();
    detail::mem_account(cat_, static_cast<std::ptrdiff_t>(n * sizeof(T)));
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  HostArray(HostArray&& o) noexcept { swap(o); }
  HostArray& operator=(HostArray&& o) noexcept {
    HostArray tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~HostArray() {
    if (!p_) return;
    std::free(p_);
    detail::mem_account(cat_, -static_cast<std::ptrdiff_t>(n_ * sizeof(T)));
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  void swap(HostArray& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cat_, o.cat_);
  }
  T* p_ = nullptr;
  size_t n_ = 0;
  Mem cat_ = Mem::Data;
};

}  // namespace yuan
