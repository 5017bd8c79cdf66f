// No wait without a deadline. Without one, a peer that is stopped (SIGSTOP), stuck or unreachable leaves every
// other rank blocked in MPI for ever, busy-polling at 100% CPU with nothing printed, until the batch system's time
// limit. Every blocking MPI call (the agreements of comm/world.h, the MPI communicator's collectives and
// transfers) runs inside a Waiting scope on its thread; a watchdog thread ends the job with one line naming the
// rank, host, operation and group when one such wait lasts longer than the deadline (dist.timeout_s).
//
// The deadline bounds one wait, not a phase: it must exceed the longest work a rank does between two collectives
// while its peers wait (a step's compute of the slowest pipeline stage, writing or reading its checkpoint shard,
// one evaluation micro-batch). NCCL operations on the GPU have a deadline of their own (dist.nccl_timeout_s).
#pragma once

namespace yuan::comm {

constexpr double kDefaultTimeoutSeconds = 300;

// Starts the watchdog on the first call (after comm::init, with more than one rank) and sets its deadline in
// seconds; a later call changes the deadline.
void watch_waits(double seconds);
// Stops and joins the watchdog thread (before MPI_Finalize: it must not call MPI_Abort after it).
void stop_watchdog();

// Ends the job for a wait in `op` on `group` (`peer` as in Waiting) that has lasted `waited` seconds, past the
// deadline `limit` of the setting `limit_key`: every rank whose wait runs out calls it, and the job gets one line,
// naming the ranks that do not answer a liveness ping (comm/liveness.h), from the lowest rank that answers.
// The watchdog calls it for MPI waits (dist.timeout_s), the NCCL communicator for its own (dist.nccl_timeout_s).
// A call while this process already ends the job with a line (another thread's wait ran out too, an error, the
// check after a SIGTERM: comm::claim_last_line) waits for that to end the process.
[[noreturn]] void end_job_for_wait(const char* op, const char* group, int peer, double waited, const char* limit_key,
                                   double limit);

// The longest wait that ended on this process since the previous call (any thread), with its operation and group:
// a stall the job rode out (a link that came back, a peer that was slow), for the step line.
struct LongestWait {
  double seconds = 0;
  const char* op = "";
  const char* group = "";
};
LongestWait take_longest_wait();
// The time the calling thread spent in waits that ended since its previous call, in seconds: what is left of a
// step is the rank's own work, which tells a straggler (it waits least) from the ranks that wait for it.
double take_waited_seconds();

// Marks the calling thread as waiting in `op` on `group` until the scope ends. Both strings must outlive the
// scope; `peer`: the world rank a transfer waits for (-1 in a collective: any member may be the late one).
// Nested scopes keep the outermost.
class Waiting {
 public:
  Waiting(const char* op, const char* group, int peer = -1);
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  bool armed_ = false;
};

}  // namespace yuan::comm
