#include "parallel/liveness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include "parallel/mpi_check.h"
#include "parallel/world.h"
#include "util/fs.h"

namespace yuan::parallel {

namespace {

constexpr int kPing = 1, kPong = 2;
// How often the responder looks for pings: a live rank answers within this (plus the network), at a cost of a
// hundred MPI_Test calls a second on a thread that otherwise sleeps.
constexpr auto kPollPeriod = std::chrono::milliseconds(10);

MPI_Comm g_comm = MPI_COMM_NULL;
int g_me = 0;  // the payload of every ping and pong: only the envelope's source matters
std::atomic<bool> g_quit{false};
std::thread g_responder;

void respond() {
  int ping = 0;
  MPI_Status st;
  MPI_Request recv = MPI_REQUEST_NULL;
  std::vector<MPI_Request> pongs;  // answers not yet delivered (a prober that stopped, say)
  // An MPI error here ends the service rather than the rank: a rank that does not answer is then named by the
  // prober, which is what a broken connection should lead to anyway.
  if (MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, g_comm, &recv) != MPI_SUCCESS) return;
  while (!g_quit.load()) {
    int done = 0;
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
  MPI_Cancel(&recv);
  MPI_Wait(&recv, MPI_STATUS_IGNORE);
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
  g_responder = std::thread(respond);
}

void stop_liveness() {
  if (g_comm == MPI_COMM_NULL) return;
  g_quit = true;
  g_responder.join();
  MPI_Comm_free(&g_comm);
}

bool liveness_served() { return g_comm != MPI_COMM_NULL; }

std::vector<int> silent_ranks(double seconds) {
  YUAN_CHECK(liveness_served(), "parallel::silent_ranks without serve_liveness");
  const int n = world().size;
  std::vector<int> answer(static_cast<size_t>(n));
  std::vector<MPI_Request> pongs(static_cast<size_t>(n), MPI_REQUEST_NULL);
  std::vector<bool> answered(static_cast<size_t>(n), false);
  answered[static_cast<size_t>(g_me)] = true;
  for (int r = 0; r < n; r++) {
    if (r == g_me) continue;
    MPI_Request ping;
    if (MPI_Irecv(&answer[r], 1, MPI_INT, r, kPong, g_comm, &pongs[r]) != MPI_SUCCESS) continue;
    // The ping is never waited for: to a silent rank it may never leave, and the job ends after this anyway.
    if (MPI_Isend(&g_me, 1, MPI_INT, r, kPing, g_comm, &ping) == MPI_SUCCESS) MPI_Request_free(&ping);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int waiting = n - 1;
  while (waiting > 0 && std::chrono::steady_clock::now() < until) {
    for (int r = 0; r < n; r++) {
      if (pongs[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      const int rc = MPI_Test(&pongs[r], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) pongs[r] = MPI_REQUEST_NULL;  // a broken connection: that rank stays silent
      if (rc == MPI_SUCCESS && done) answered[r] = true;
      if (rc != MPI_SUCCESS || done) waiting--;
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  // The receives of silent ranks stay posted: the caller ends the process.
  std::vector<int> silent;
  for (int r = 0; r < n; r++)
    if (!answered[r]) silent.push_back(r);
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

}  // namespace yuan::parallel
