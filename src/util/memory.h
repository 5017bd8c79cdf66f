// Host memory that knows what it is for. Every large host allocation goes through HostArray so that the
// memory plan, the step log and the tests (e.g. "optimizer bytes shrink as 1/N under ZeRO") read one
// account instead of guessing from RSS.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace yuan {

enum class Mem { Params, Grads, Optimizer, Activations, Data, Comm, kCount };
size_t mem_bytes(Mem m);       // live bytes in this category on this process
size_t host_peak_rss_bytes();  // VmHWM of this process
size_t host_rss_bytes();       // VmRSS of this process

namespace detail {
void mem_account(Mem m, std::ptrdiff_t delta);
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
    if (!p_) throw std::bad_alloc();
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
