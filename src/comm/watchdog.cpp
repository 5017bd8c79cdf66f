#include "comm/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "comm/liveness.h"
#include "comm/mpi_check.h"
#include "comm/world.h"

namespace yuan::comm {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One per thread that waits in MPI (the main thread, ZeRO-3's communication threads), read by the watchdog without
// locks: `since_ns` is written last on entry and first on exit, so a non-zero value comes with its op and group.
struct Slot {
  std::atomic<bool> taken{false};
  std::atomic<int64_t> since_ns{0};  // 0: not waiting
  std::atomic<const char*> op{nullptr}, group{nullptr};
  std::atomic<int> peer{-1};
};
constexpr int kSlots = 64;
// What a rank that does not write the job's line waits beyond the reporter's ping before pinging it again.
constexpr double kReporterSeconds = 3;
// From a rank's MPI_Abort to the end of its launcher and of itself where MPI cannot end them (liveness.h).
// With the deadline's resolution (1 s), two pings (4 s each) and the wait between, a rank that does not report
// ends within dist.timeout_s + 24 s.
constexpr unsigned kAbortGraceSeconds = 8;
Slot g_slots[kSlots];

// The calling thread's slot, taken on its first wait and given back when the thread ends. A thread beyond
// kSlots at once goes unwatched rather than failing.
struct ThreadSlot {
  Slot* slot = nullptr;
  ThreadSlot() {
    for (Slot& s : g_slots) {
      bool expected = false;
      if (s.taken.compare_exchange_strong(expected, true)) {
        slot = &s;
        break;
      }
    }
  }
  ~ThreadSlot() {
    if (slot) slot->taken.store(false);
  }
};
Slot* my_slot() {
  thread_local ThreadSlot t;
  return t.slot;
}

class Watchdog {
 public:
  ~Watchdog() { stop(); }
  void start(double seconds) {
    limit_ns_.store(static_cast<int64_t>(seconds * 1e9));
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) {
      quit_ = false;
      thread_ = std::thread([this] { run(); });
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    int64_t last = now_ns();
    while (!quit_) {
      const int64_t limit = limit_ns_.load();
      // A tenth of the deadline, within [10 ms, 1 s]: the job ends within 10% (or a second) past it.
      const int64_t period = std::clamp<int64_t>(limit / 10, 10000000, 1000000000);
      if (cv_.wait_for(lock, std::chrono::nanoseconds(period), [this] { return quit_; })) return;
      const int64_t now = now_ns();
      // Woken far too late: this process itself was stopped (SIGSTOP, then the SIGCONT with which mpirun starts
      // killing the job). Its peers did not keep it waiting, so its waits start over rather than blaming them.
      const bool was_stopped = now - last > 2 * period + 1000000000;
      last = now;
      for (Slot& s : g_slots) {
        int64_t since = s.since_ns.load();
        if (since != 0 && was_stopped) s.since_ns.compare_exchange_strong(since, now);  // unless it just ended
        else if (since != 0 && now - since > limit)
          end_job_for_wait(s.op.load(), s.group.load(), s.peer.load(), (now - since) / 1e9, "dist.timeout_s",
                           limit / 1e9);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  bool quit_ = false;
  std::atomic<int64_t> limit_ns_{0};
};
Watchdog g_watchdog;

// The longest wait since take_longest_wait(): the atomic for the common case (a wait shorter than it, no lock),
// the mutex for the rare longer one and its names.
std::atomic<int64_t> g_longest_ns{0};
std::mutex g_longest_mu;
LongestWait g_longest;

thread_local int64_t t_waited_ns = 0;  // this thread's, since take_waited_seconds()

void note_wait(int64_t ns, const char* op, const char* group) {
  t_waited_ns += ns;
  if (ns <= g_longest_ns.load()) return;
  std::lock_guard<std::mutex> lock(g_longest_mu);
  if (ns <= g_longest_ns.load()) return;
  g_longest_ns.store(ns);
  g_longest = {ns / 1e9, op, group};
}

}  // namespace

void end_job_for_wait(const char* op, const char* group, int peer, double waited, const char* limit_key,
                      double limit) {
  if (!claim_last_line())
    for (;;) pause();
  std::string who = "a peer is stopped, stuck or unreachable (the ranks that print no such line)";
  bool report = true;
  if (liveness_served()) {
    // Long enough for a live rank's responder on a loaded node; short against the deadline it adds to.
    const double window = std::clamp(limit / 5, 2.0, 4.0);
    const std::vector<int> silent = silent_ranks(window);
    who = silent.empty()
              ? std::string("every rank answers a liveness ping, so none is stopped, dead or cut off: a peer is stuck "
                            "outside MPI or waits in another operation")
              : strf("%s %s not answer a liveness ping within %g s: stopped, dead or cut off from this node",
                     describe_ranks(silent, world_hosts()).c_str(), silent.size() == 1 ? "does" : "do", window);
    // One line for the job: the lowest rank that answers writes it and ends. The others give it the time of its
    // own ping (its wait ran out a little later, say), then ping it again: gone, it has written the line (or the
    // job is ending), and they end without one; still there, it has not, and they write theirs.
    int lowest = 0;
    for (int r : silent)
      if (r == lowest) lowest++;
    if (lowest != process_rank()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(window + kReporterSeconds));
      const std::vector<int> now_silent = silent_ranks(window);
      report = std::find(now_silent.begin(), now_silent.end(), lowest) == now_silent.end();
    }
  }
  if (report) {
    std::fprintf(stderr,
                 "error: [rank %d@%s] no progress for %.0f s: waiting in %s on group %s%s, longer than %s %g; %s; "
                 "ending the job\n",
                 process_rank(), process_host().c_str(), waited, op, group,
                 peer >= 0 ? strf(" for world rank %d", peer).c_str() : "", limit_key, limit, who.c_str());
    std::fflush(stderr);
  }
  // The launcher may wait for ever on a node it cannot reach, and so may this rank's MPI_Abort: past a grace
  // period the watcher kills the launcher and the alarm this process (SIGALRM's default action ends it).
  end_launcher_after(kAbortGraceSeconds);
  alarm(kAbortGraceSeconds);
  // The launcher's SIGTERM to the other ranks then comes from this line's MPI_Abort: they stay quiet.
  if (report) announce_end();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; should it, the job must still end
}

void watch_waits(double seconds) {
  YUAN_CHECK(initialized(), "comm::watch_waits before comm::init");
  if (world().size == 1) return;
  {
    StartupDeadline deadline;  // the watchdog is not watching yet
    serve_liveness();  // collective: the first call comes from every rank at once (main)
  }
  g_watchdog.start(seconds);
}

void stop_watchdog() {
  g_watchdog.stop();
  stop_liveness();
}

Waiting::Waiting(const char* op, const char* group, int peer) {
  Slot* s = my_slot();
  if (!s || s->since_ns.load() != 0) return;
  s->op.store(op);
  s->group.store(group);
  s->peer.store(peer);
  s->since_ns.store(now_ns());
  armed_ = true;
}

Waiting::~Waiting() {
  if (!armed_) return;
  Slot* s = my_slot();
  const int64_t since = s->since_ns.load();
  s->since_ns.store(0);
  note_wait(now_ns() - since, s->op.load(), s->group.load());
}

double take_waited_seconds() {
  const double s = t_waited_ns / 1e9;
  t_waited_ns = 0;
  return s;
}

LongestWait take_longest_wait() {
  std::lock_guard<std::mutex> lock(g_longest_mu);
  const LongestWait out = g_longest;
  g_longest = {};
  g_longest_ns.store(0);
  return out;
}

}  // namespace yuan::comm
