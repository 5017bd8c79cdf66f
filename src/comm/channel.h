// Point-to-point transfers of host memory on a communicator of their own, so that they never meet the training's
// messages: the fast checkpoint tier's partner exchange and redistribution (train/local_exchange.h).
//
// Their waits have one of two deadlines, both kept here. wait() has the watchdog's (comm/watchdog.h): past
// dist.timeout_s the job ends with one line, as for every other blocking call of comm/. wait_until() has the
// caller's own budget and cancels what is left when it runs out, for traffic whose loss must not end the job (a lost
// partner costs only the partner copies).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

namespace yuan::comm {

class Channel;

// Transfers posted on a Channel, waited for together. The memory they read or write must outlive them (or their
// wait). Destroying them cancels those still pending.
class Transfers {
 public:
  Transfers();
  ~Transfers();
  Transfers(const Transfers&) = delete;
  Transfers& operator=(const Transfers&) = delete;

  // True once every transfer posted so far is complete; false when `deadline` (util/log.h's now_seconds()) passes
  // first, the pending ones cancelled. Polls, so that other threads' MPI calls go on beside it. Either way the
  // transfers are done with, and new ones may be posted.
  bool wait_until(double deadline);
  // Waits for every transfer posted so far, with the watchdog's deadline; `op` names the wait in its line.
  void wait(const char* op);

 private:
  friend class Channel;
  struct Requests;
  std::unique_ptr<Requests> requests_;
};

class Channel {
 public:
  Channel();  // collective over the world: a duplicate of its communicator
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Posts the sending of `bytes` at `data` to world rank `peer` (or the receiving from it), as messages of at most
  // 1 GiB (MPI counts are ints), in order, on `tag`: a receive matches a send of the same size and tag.
  void send(Transfers& t, const void* data, size_t bytes, int peer, int tag);
  void receive(Transfers& t, void* data, size_t bytes, int peer, int tag);
  // Collective: every rank's `mine`, by rank; `op` names the wait.
  std::vector<unsigned long long> all_gather(unsigned long long mine, const char* op);

 private:
  struct Comm;
  std::unique_ptr<Comm> comm_;
};

}  // namespace yuan::comm
