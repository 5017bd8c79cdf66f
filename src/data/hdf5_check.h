// HDF5_CHECK: the one error check for HDF5 calls, in the nccl-tests style. A negative return becomes a
// yuan::Error with the caller's context (which names the file), HDF5's own reason, the rank and file:line:
//   hid_t f = HDF5_CHECK(H5Fopen(path, H5F_ACC_RDONLY, fapl), "%s: cannot open", path);
// Every HDF5 call runs under Hdf5Lock: serial HDF5 builds are not thread-safe, and the loader's prefetch
// thread, the validation loader and checkpoint code may all want the library at once. The lock is recursive
// so that Hid, which closes its identifier under the lock, can be destroyed anywhere, lock held or not.
#pragma once
#include <hdf5.h>

#include <mutex>
#include <string>
#include <utility>

#include "util/error.h"

namespace yuan {

inline std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) {
    // HDF5 prints its error stack to stderr on every failure unless told not to, per thread in thread-safe
    // builds; failures must surface once, as the Error below.
    static thread_local bool quiet = (H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), true);
    (void)quiet;
  }

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Owns one HDF5 identifier and closes it, also when an Error unwinds the code that opened it.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    reset();
    std::swap(id_, o.id_);
    close_ = o.close_;
    return *this;
  }
  ~Hid() { reset(); }
  void reset() {
    if (id_ < 0) return;
    Hdf5Lock lock;
    close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5's reason for the last failure on this thread: the outermost description (what the API call could not
// do) and the innermost one (why: "file signature not found", "truncated file: eof = ...").
inline std::string hdf5_error_message() {
  struct Ends {
    std::string inner, outer;
  } ends;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* ends = static_cast<Ends*>(data);
        if (n == 0) ends->inner = e->desc ? e->desc : "";
        ends->outer = e->desc ? e->desc : "";
        return 0;
      },
      &ends);
  H5Eclear2(H5E_DEFAULT);
  if (ends.inner.empty()) return "no HDF5 error message";
  return ends.outer == ends.inner ? ends.inner : ends.outer + ": " + ends.inner;
}

template <typename T, typename Context>
T hdf5_check(T ret, const char* file, int line, Context&& context) {
  if (ret < 0)
    throw Error(strf("%s: %s [HDF5, rank %d, %s:%d]", context().c_str(), hdf5_error_message().c_str(),
                     process_rank(), file, line));
  return ret;
}

}  // namespace yuan

#define HDF5_CHECK(expr, ...) ::yuan::hdf5_check((expr), __FILE__, __LINE__, [&] { return ::yuan::strf(__VA_ARGS__); })
