#include "comm/comm_thread.h"

#include <utility>

namespace yuan::comm {

CommThread::CommThread(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)), thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommThread::all_gather(void* buf, std::vector<size_t> counts, DType t) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back([this, buf, counts = std::move(counts), t] { comm_->all_gather(buf, counts, t); });
  cv_.notify_all();
  return ++issued_;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

// After an error the remaining calls are dropped: their peers may never match them.
void CommThread::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() || error_) return;
    std::function<void()> call = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr err;
    try {
      call();
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    error_ = err;
    done_++;
    cv_.notify_all();
  }
}

}  // namespace yuan::comm
