#include "optim/delayed_update.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "util/error.h"
#include "util/log.h"

namespace yuan {

DelayedUpdate::~DelayedUpdate() {
  if (thread_.joinable()) thread_.join();
}

void DelayedUpdate::start(std::function<void()> work) {
  YUAN_CHECK(!in_flight(), "DelayedUpdate: an update started while the previous one is in flight");
  // Read here: a new thread's team size starts from the process default, not from configure_threads
  // (util/threads.cpp).
  const int threads = std::max(1, omp_get_max_threads() - 1);
  thread_ = std::thread([this, work = std::move(work), threads] {
    omp_set_num_threads(threads);
    try {
      const double t0 = now_seconds();
      work();
      seconds_ = now_seconds() - t0;
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

double DelayedUpdate::wait() {
  if (!thread_.joinable()) return 0;
  thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return seconds_;
}

}  // namespace yuan
