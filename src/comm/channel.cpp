#include "comm/channel.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#include "util/log.h"

namespace yuan::comm {

namespace {
constexpr size_t kChunk = size_t{1} << 30;  // bytes per message: MPI counts are ints
}  // namespace

struct Transfers::Requests {
  std::vector<MPI_Request> pending;
  void cancel() {
    for (MPI_Request& r : pending)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    pending.clear();
  }
};

Transfers::Transfers() : requests_(std::make_unique<Requests>()) {}
Transfers::~Transfers() { requests_->cancel(); }

bool Transfers::wait_until(double deadline) {
  std::vector<MPI_Request>& reqs = requests_->pending;
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (done) {
      reqs.clear();
      return true;
    }
    if (now_seconds() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  requests_->cancel();
  return false;
}

void Transfers::wait(const char* op) {
  std::vector<MPI_Request>& reqs = requests_->pending;
  Waiting wait(op, "world");
  MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  reqs.clear();
}

// A duplicate of the world communicator, freed with it.
struct Channel::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  ~Comm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

Channel::Channel() : comm_(std::make_unique<Comm>()) {
  Waiting wait("comm_dup", "world");
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_->comm));
}

Channel::~Channel() = default;

void Channel::send(Transfers& t, const void* data, size_t bytes, int peer, int tag) {
  const char* p = static_cast<const char*>(data);
  for (size_t at = 0; at < bytes; at += kChunk) {
    MPI_Request& r = t.requests_->pending.emplace_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Isend(p + at, static_cast<int>(std::min(kChunk, bytes - at)), MPI_BYTE, peer, tag, comm_->comm, &r));
  }
}

void Channel::receive(Transfers& t, void* data, size_t bytes, int peer, int tag) {
  char* p = static_cast<char*>(data);
  for (size_t at = 0; at < bytes; at += kChunk) {
    MPI_Request& r = t.requests_->pending.emplace_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Irecv(p + at, static_cast<int>(std::min(kChunk, bytes - at)), MPI_BYTE, peer, tag, comm_->comm, &r));
  }
}

std::vector<unsigned long long> Channel::all_gather(unsigned long long mine, const char* op) {
  std::vector<unsigned long long> all(static_cast<size_t>(world().size));
  Waiting wait(op, "world");
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm_->comm));
  return all;
}

}  // namespace yuan::comm
