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
#include <string_view>
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
    // A file whose close failed (a full disk) is left half torn down by HDF5 1.10, and the library's exit handler,
    // closing it again, crashes the process after the error was reported. Every file is closed by its Hid
    // before exit, so the handler has nothing to do. It must be declined before the library initialises.
    static const bool no_exit_handler = (H5dont_atexit(), true);
    (void)no_exit_handler;
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

// HDF5's reason for the last failure on this thread, on one line: the outermost description (what the API call
// could not do), the innermost one (why: "file signature not found", "truncated file: eof = ...") and, where a
// system call failed, the operating system's reason ("No space left on device").
inline std::string hdf5_error_message() {
  struct Walk {
    std::string inner, outer, os;
  } walk;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        std::string desc = e->desc ? e->desc : "";
        // A failed system call reads "file write failed: time = <ctime(3), which ends in a newline>, filename =
        // ..., errno = 28, error message = 'No space left on device', buf = 0x..., ...": its first words and the
        // reason say it all, the file is in the caller's context.
        constexpr std::string_view tag = "error message = '";
        if (const size_t at = desc.find(tag); at != std::string::npos) {
          const size_t from = at + tag.size();
          if (w->os.empty()) w->os = desc.substr(from, desc.find('\'', from) - from);
          desc = desc.substr(0, desc.find_first_of(":,"));
        }
        if (n == 0) w->inner = desc;
        w->outer = desc;
        return 0;
      },
      &walk);
  H5Eclear2(H5E_DEFAULT);
  std::string msg;
  auto add = [&msg](const std::string& part) {
    if (!part.empty()) msg += (msg.empty() ? "" : ": ") + part;
  };
  add(walk.outer);
  if (walk.inner != walk.outer) add(walk.inner);
  add(walk.os);
  if (msg.empty()) return "no HDF5 error message";
  // An error is one line wherever HDF5's descriptions came from.
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return msg;
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
