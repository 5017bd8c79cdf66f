// optim.delayed_update's thread (optim/zero.h): step t's AdamW runs on a host thread of its own while step t+1's
// forward and backward run, and the caller lands its result before step t+2's. The work may call no MPI
// (MPI_THREAD_FUNNELED) and no communicator; what it throws is rethrown by wait() in the caller's thread.
#pragma once
#include <exception>
#include <functional>
#include <thread>

namespace yuan {

class DelayedUpdate {
 public:
  DelayedUpdate() = default;
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;
  ~DelayedUpdate();  // waits for work still running (its error is dropped: the owner is being torn down)

  // Runs `work` on a new thread with one OpenMP thread fewer than the caller's team, leaving a core to the caller,
  // which keeps running OpenMP and launching kernels meanwhile. One at a time.
  void start(std::function<void()> work);
  bool in_flight() const { return thread_.joinable(); }
  // Waits for the work started last; rethrows what it threw; returns the seconds it ran.
  double wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;
  double seconds_ = 0;
};

}  // namespace yuan
