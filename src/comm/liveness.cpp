#include "comm/liveness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/mpi_check.h"
#include "comm/world.h"
#include "util/fs.h"

namespace yuan::comm {

namespace {

constexpr int kPing = 1, kPong = 2, kEnd = 3;
// How often the responder looks for pings: a live rank answers within this (plus the network), at a cost of a
// hundred MPI_Test calls a second on a thread that otherwise sleeps.
constexpr auto kPollPeriod = std::chrono::milliseconds(10);

MPI_Comm g_comm = MPI_COMM_NULL;
int g_me = 0;  // the payload of every ping and pong: only the envelope's source matters
std::atomic<bool> g_quit{false};
std::atomic<bool> g_peer_ends{false};  // a peer has announced that it ends the job with its own line
std::thread g_responder;
std::thread g_sigterm_watch;  // waits for a SIGTERM and checks (check_after_sigterm)

// One ping of every rank (silent_ranks). After a node is lost, any MPI call that drives Open MPI's progress can
// stay inside it for good: a send on a connection that broke with the node fails (EPIPE), Open MPI reports that
// to its launcher and waits for an answer that a launcher ending the job does not give, and while that thread
// waits no other thread moves TCP traffic (seen on the test cluster). So the pings are sent and the answers
// received on threads of their own, another one takes over from a thread that has stood still for
// kThreadPatience, and the caller, which makes no MPI call, reads the answers at its deadline whatever became of
// those threads. The answers are taken as they come (MPI_Improbe), with no receive posted per rank, so that a
// thread that takes over needs nothing from the one it replaces. The state is shared with threads that may
// outlive the call.
struct Sweep {
  Sweep(int ranks, std::chrono::steady_clock::time_point deadline)
      : n(ranks), until(deadline), answered(new std::atomic<bool>[ranks]()) {}
  const int n;
  const std::chrono::steady_clock::time_point until;
  std::unique_ptr<std::atomic<bool>[]> answered;
  std::atomic<int> waiting{0};  // ranks that have not answered
  std::atomic<int> next{0};     // the next rank to ping
  std::atomic<long> beats{0};   // rounds of the receiving threads
  std::atomic<int> running{0};  // threads not yet returned
};
constexpr auto kThreadPatience = std::chrono::milliseconds(20);
// At most this many senders and as many receivers: a lost node of many ranks strands a sender on each.
constexpr int kMaxSweepThreads = 64;
// How long the caller waits, once every rank has answered, for the threads to return (none is stuck then).
constexpr auto kSweepGrace = std::chrono::milliseconds(200);

// A ping or note to a rank whose process is gone writes on a closed connection, and the SIGPIPE that raises, at
// its default action, would end this process before it names anyone (seen when a node is killed). Both go out when
// the job ends or stops, so ignoring SIGPIPE from then on costs nothing: a write to a closed pipe fails instead.
void ignore_sigpipe() { std::signal(SIGPIPE, SIG_IGN); }

void collect_pongs(std::shared_ptr<Sweep> s) {
  while (s->waiting.load() > 0 && std::chrono::steady_clock::now() < s->until) {
    s->beats++;
    int found = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kPong, g_comm, &found, &msg, &st) != MPI_SUCCESS) break;
    if (!found) {
      std::this_thread::sleep_for(kPollPeriod);
      continue;
    }
    int payload = 0;
    if (MPI_Mrecv(&payload, 1, MPI_INT, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    if (!s->answered[st.MPI_SOURCE].exchange(true)) s->waiting--;
  }
  s->running--;
}

void send_pings(std::shared_ptr<Sweep> s) {
  for (int r; (r = s->next.fetch_add(1)) < s->n;) {
    if (r == g_me) continue;
    MPI_Request ping;
    // The ping is never waited for: to a silent rank it may never leave.
    if (MPI_Isend(&g_me, 1, MPI_INT, r, kPing, g_comm, &ping) == MPI_SUCCESS) MPI_Request_free(&ping);
  }
  s->running--;
}

// After a SIGTERM (see liveness.h): a plain stop when every rank answers, else the launcher is ending the job over
// the silent ranks, which no other line will name.
void check_after_sigterm() {
  const std::vector<int> silent = silent_ranks(kEndingPingSeconds);
  if (silent.empty() || g_peer_ends.load() || ending()) return;
  // One line for the job, from the lowest rank that answers: the ranks that answered got the same SIGTERM and see
  // the same silence.
  int lowest = 0;
  for (int r : silent)
    if (r == lowest) lowest++;
  if (!claim_last_line()) return;
  if (lowest == g_me) {
    const std::string who = describe_silent(silent, kEndingPingSeconds, node_map(), world_hosts());
    std::fprintf(stderr, "error: [rank %d@%s] the launcher is ending the job (SIGTERM): %s; ending\n", g_me,
                 process_host().c_str(), who.c_str());
    std::fflush(stderr);
  }
  // The stop this SIGTERM asked for cannot finish without the silent ranks, and the launcher's SIGKILL follows.
  std::_Exit(1);
}

// Not the responder's: its MPI calls may be the ones that stay inside Open MPI once a node is lost, and it must
// go on answering the other ranks' checks.
void watch_for_sigterm() {
  while (!g_quit.load()) {
    if (stop_signal_received() == SIGTERM) return check_after_sigterm();
    std::this_thread::sleep_for(kPollPeriod);
  }
}

void respond() {
  int ping = 0, end_note = 0;
  MPI_Status st;
  MPI_Request recv = MPI_REQUEST_NULL, end_recv = MPI_REQUEST_NULL;
  std::vector<MPI_Request> pongs;  // answers not yet delivered (a prober that stopped, say)
  // An MPI error here ends the service rather than the rank: a rank that does not answer is then named by the
  // prober, which is what a broken connection should lead to anyway.
  if (MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, g_comm, &recv) != MPI_SUCCESS) return;
  if (MPI_Irecv(&end_note, 1, MPI_INT, MPI_ANY_SOURCE, kEnd, g_comm, &end_recv) != MPI_SUCCESS) return;
  while (!g_quit.load()) {
    int done = 0;
    if (end_recv != MPI_REQUEST_NULL) {
      if (MPI_Test(&end_recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) end_recv = MPI_REQUEST_NULL;
      if (done) g_peer_ends = true;  // one note is enough: the request is done (MPI_REQUEST_NULL)
      done = 0;
    }
    if (MPI_Test(&recv, &done, &st) != MPI_SUCCESS) return;
    if (done) {
      MPI_Request pong;
      if (MPI_Isend(&g_me, 1, MPI_INT, st.MPI_SOURCE, kPong, g_comm, &pong) == MPI_SUCCESS) pongs.push_back(pong);
      if (MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, g_comm, &recv) != MPI_SUCCESS) return;
      continue;  // a prober pings every rank at once: answer the burst before sleeping
    }
    for (size_t i = 0; i < pongs.size();) {
      int sent = 0;
      if (MPI_Test(&pongs[i], &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS || sent) {
        pongs[i] = pongs.back();
        pongs.pop_back();
      } else {
        i++;
      }
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  for (MPI_Request* r : {&recv, &end_recv}) {
    if (*r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(r);
    MPI_Wait(r, MPI_STATUS_IGNORE);
  }
  for (MPI_Request& p : pongs) MPI_Request_free(&p);
}

bool is_open_mpi_launcher(pid_t pid) {
  std::string comm;
  try {
    comm = read_text(strf("/proc/%d/comm", static_cast<int>(pid)));
  } catch (const Error&) {
    return false;
  }
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  for (const char* name : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted"})
    if (comm == name) return true;
  return false;
}

}  // namespace

void serve_liveness() {
  if (g_comm != MPI_COMM_NULL || world().size == 1 || !world().thread_multiple) return;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm));
  MPI_CHECK(MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN));
  g_me = world().rank;
  g_quit = false;
  g_peer_ends = false;
  g_responder = std::thread(respond);
  g_sigterm_watch = std::thread(watch_for_sigterm);
}

void stop_liveness() {
  if (g_comm == MPI_COMM_NULL) return;
  g_quit = true;
  g_responder.join();
  g_sigterm_watch.join();
  MPI_Comm_free(&g_comm);
}

bool liveness_served() { return g_comm != MPI_COMM_NULL; }

std::vector<int> silent_ranks(double seconds) {
  YUAN_CHECK(liveness_served(), "comm::silent_ranks without serve_liveness");
  ignore_sigpipe();
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto sweep = std::make_shared<Sweep>(world().size, until);
  sweep->waiting = sweep->n - 1;
  const auto start = [&](void (*work)(std::shared_ptr<Sweep>)) {
    sweep->running++;
    std::thread(work, sweep).detach();
  };
  int senders = 0, receivers = 0, seen_next = -1;
  long seen_beats = -1;
  while (sweep->waiting.load() > 0 && Clock::now() < until) {
    const int next = sweep->next.load();
    if (next < sweep->n && (senders == 0 || next == seen_next) && senders < kMaxSweepThreads) {
      start(send_pings);
      senders++;
    }
    const long beats = sweep->beats.load();
    if ((receivers == 0 || beats == seen_beats) && receivers < kMaxSweepThreads) {
      start(collect_pongs);
      receivers++;
    }
    seen_next = next;
    seen_beats = beats;
    std::this_thread::sleep_for(kThreadPatience);
  }
  // With every rank answering, the run goes on (a plain stop): its threads must be out of MPI before it finalizes.
  const auto grace = Clock::now() + kSweepGrace;
  while (sweep->waiting.load() == 0 && sweep->running.load() > 0 && Clock::now() < grace)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<int> silent;
  for (int r = 0; r < sweep->n; r++)
    if (r != g_me && !sweep->answered[r].load()) silent.push_back(r);
  return silent;
}

std::string describe_ranks(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  // Runs of consecutive ranks ("2-3"), then the runs of one host joined ("1, 3 on node1").
  std::vector<std::pair<std::string, std::string>> parts;  // (runs, host)
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1 && hosts[ranks[j + 1]] == hosts[ranks[i]]) j++;
    const std::string run = j == i ? std::to_string(ranks[i]) : strf("%d-%d", ranks[i], ranks[j]);
    if (!parts.empty() && parts.back().second == hosts[ranks[i]]) parts.back().first += ", " + run;
    else parts.emplace_back(run, hosts[ranks[i]]);
    i = j + 1;
  }
  std::string out = ranks.size() == 1 ? "world rank " : "world ranks ";
  for (size_t p = 0; p < parts.size(); p++) {
    if (p > 0) out += p + 1 == parts.size() ? " and " : ", ";
    out += parts[p].first + " on " + parts[p].second;
  }
  return out;
}

std::string describe_silent(const std::vector<int>& silent, double seconds, const layout::NodeMap& nodes,
                            const std::vector<std::string>& hosts) {
  // The nodes of the silent ranks, named as lost only when every rank of each of them is silent.
  std::vector<int> lost;
  bool whole = true;
  for (int r : silent) {
    const int node = nodes.node[r];
    if (std::find(lost.begin(), lost.end(), node) != lost.end()) continue;
    lost.push_back(node);
    for (int q : nodes.ranks_on(node)) whole = whole && std::binary_search(silent.begin(), silent.end(), q);
  }
  std::string what = "stopped, dead or cut off";
  if (whole) {
    what.clear();
    for (size_t i = 0; i < lost.size(); i++)
      what += (i == 0 ? "" : i + 1 == lost.size() ? " and " : ", ") + nodes.names[lost[i]];
    what += lost.size() == 1 ? " is lost or cut off" : " are lost or cut off";
  }
  return strf("%s %s not answer a liveness ping within %g s: %s", describe_ranks(silent, hosts).c_str(),
              silent.size() == 1 ? "does" : "do", seconds, what.c_str());
}

void announce_end() {
  if (!liveness_served()) return;
  ignore_sigpipe();
  // On a thread of its own, as the pings (Sweep): a send on a connection that broke may never return. Long enough
  // for the notes to leave on live connections; the launcher's teardown comes after this.
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(kEndingPingSeconds / 5);
  const auto sent = std::make_shared<std::atomic<bool>>(false);
  std::thread([sent, until] {
    std::vector<MPI_Request> notes;
    for (int r = 0; r < world().size; r++) {
      MPI_Request note;
      if (r != g_me && MPI_Isend(&g_me, 1, MPI_INT, r, kEnd, g_comm, &note) == MPI_SUCCESS) notes.push_back(note);
    }
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until &&
           MPI_Testall(static_cast<int>(notes.size()), notes.data(), &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS)
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    sent->store(true);
  }).detach();
  while (!sent->load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void end_launcher_after(double seconds) {
  const pid_t parent = getppid();
  if (!is_open_mpi_launcher(parent)) return;
  // A pidfd names that very process: the parent may end and its pid be reused before the watcher's time is up.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, parent, 0));
  if (pidfd < 0) return;
  const int ms = static_cast<int>(seconds * 1000);
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls: the parent has threads. Detached by setsid(), so that the launcher killing
    // this rank's process group does not take the watcher with it; no inherited descriptor, so that none of the
    // launcher's output pipes stays open and makes it wait for this process.
    setsid();
    const int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 2; fd++) dup2(null, fd);
    syscall(SYS_close_range, 3, pidfd - 1, 0);
    syscall(SYS_close_range, pidfd + 1, ~0U, 0);
    pollfd p = {pidfd, POLLIN, 0};
    if (poll(&p, 1, ms) == 0) syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    _exit(0);
  }
  close(pidfd);
}

}  // namespace yuan::comm
