// A host communicator's collectives on a thread of their own, so that they run while the caller computes: what a
// communication stream is to NCCL, for the CPU backend (ZeRO-3 prefetches the next module's weights this way).
// Calls run one after the other in the order they are issued, on a communicator no other thread uses (a
// duplicate of the group's MPI communicator, which needs MPI_THREAD_MULTIPLE: comm/world.h). Every member of
// the group issues the same calls in the same order, as for any collective.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace yuan::comm {

class CommThread {
 public:
  explicit CommThread(std::unique_ptr<Communicator> comm);
  ~CommThread();  // lets the calls already issued finish
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Communicator::all_gather, started on the thread; `buf` must stay untouched until wait() of the returned
  // ticket, which returns once the call is done and rethrows its error.
  uint64_t all_gather(void* buf, std::vector<size_t> counts, DType t);
  void wait(uint64_t ticket);

 private:
  void run();

  std::unique_ptr<Communicator> comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t issued_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace yuan::comm
