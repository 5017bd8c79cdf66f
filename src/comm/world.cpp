#include "comm/world.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

#include "comm/liveness.h"
#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "util/crash_report.h"

namespace yuan::comm {

namespace {
WorldInfo g_world;
std::vector<std::string> g_hosts;  // by rank, so errors can say where the odd rank runs
layout::NodeMap g_nodes;
MPI_Comm g_node_comm = MPI_COMM_NULL;
bool g_initialized = false;
bool g_owns_mpi = false;  // false when the embedding program initialised MPI itself
// Written by the signal handler, read by the main thread and the liveness service's: a lock-free atomic is both
// async-signal-safe and free of data races.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop signal handler needs a lock-free atomic");
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }
std::atomic<bool> g_ending{false}, g_last_line{false};

// StartupDeadline's line, written before the alarm is armed: the handler may only write(2) and _exit.
char g_startup_line[512];
size_t g_startup_len = 0;
extern "C" void on_startup_deadline(int) {
  [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, g_startup_line, g_startup_len);
  _exit(1);
}
}  // namespace

StartupDeadline::StartupDeadline() {
  // Whole seconds up to 30 days, as the deadline keys (config.cpp); anything else is the default, said below.
  const char* env = std::getenv("YUANLM_START_TIMEOUT_S");
  char* end = nullptr;
  const double asked = env ? std::strtod(env, &end) : 0;
  const bool valid = env && end != env && *end == '\0' && asked >= 1 && asked <= 30 * 86400;
  const int seconds = valid ? static_cast<int>(asked) : static_cast<int>(kDefaultTimeoutSeconds);
  if (env && !valid)
    std::fprintf(stderr, "warning: YUANLM_START_TIMEOUT_S=%s is not a number of seconds in [1, 2592000]: using %d\n",
                 env, seconds);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  // Before MPI_Init the rank is known only from the launcher's environment.
  const char* rank = nullptr;
  for (const char* key : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (!rank) rank = std::getenv(key);
  const int n = std::snprintf(g_startup_line, sizeof g_startup_line,
                              "error: [rank %s@%s] MPI start-up (MPI_Init and the first collectives over the world) "
                              "did not finish in %d s (YUANLM_START_TIMEOUT_S): a rank of the job did not start, or "
                              "its node is gone or cut off; ending\n",
                              rank ? rank : "?", host, seconds);
  g_startup_len = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof g_startup_line - 1);
  std::signal(SIGALRM, on_startup_deadline);
  alarm(static_cast<unsigned>(seconds));
}

StartupDeadline::~StartupDeadline() {
  alarm(0);
  std::signal(SIGALRM, SIG_DFL);
}

void init(int* argc, char*** argv) {
  if (g_initialized) return;
  StartupDeadline deadline;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    // MULTIPLE lets ZeRO-3's gathers run on a thread of their own (comm/comm_thread.h); everything else calls
    // MPI from the main thread only (the loader thread never does), for which FUNNELED is enough. A library
    // offering less cannot be trusted with OpenMP regions around MPI calls.
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    g_owns_mpi = true;
    if (provided < MPI_THREAD_FUNNELED) {
      std::fprintf(stderr, "error: the MPI library provides thread level %d < MPI_THREAD_FUNNELED\n", provided);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_initialized = true;
  int level = 0;
  MPI_CHECK(MPI_Query_thread(&level));
  g_world.thread_multiple = level == MPI_THREAD_MULTIPLE;

  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_world.size));
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world.rank, MPI_INFO_NULL, &g_node_comm));
  MPI_CHECK(MPI_Comm_set_errhandler(g_node_comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(g_node_comm, &g_world.local_rank));
  MPI_CHECK(MPI_Comm_size(g_node_comm, &g_world.local_size));
  // Keyed by world rank, the split makes the node's lowest rank its local rank 0: the node's leader.
  int leader = g_world.rank;
  MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, g_node_comm));
  std::vector<int> leaders(static_cast<size_t>(g_world.size));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  g_world.host.assign(name, static_cast<size_t>(len));
  std::vector<char> all(static_cast<size_t>(g_world.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD));
  g_hosts.clear();
  for (int r = 0; r < g_world.size; r++) g_hosts.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  g_nodes = layout::NodeMap::from_leaders(leaders, g_hosts);
  g_world.node = g_nodes.node[g_world.rank];
  set_process_identity(g_world.rank, g_world.host);
  // The fatal-signal report (installed by main before MPI_Init) names the rank and node from now on, and takes
  // back any of its signals that MPI's start-up gave another handler.
  set_crash_identity(g_world.rank, g_world.host.c_str());
}

void finalize() {
  if (!g_initialized) return;
  note_ending();  // peers may leave MPI_Finalize's start before this one: no longer a sign of a lost node
  // MPI_Finalize is not watched: under mpirun, export and sample leave ranks other than 0 waiting in it for as
  // long as rank 0 writes or generates.
  stop_watchdog();
  g_initialized = false;
  int done = 0;
  MPI_Finalized(&done);
  if (!done && g_node_comm != MPI_COMM_NULL) MPI_Comm_free(&g_node_comm);
  if (g_owns_mpi && !done) MPI_Finalize();
}

bool initialized() { return g_initialized; }
const WorldInfo& world() { return g_world; }
const layout::NodeMap& node_map() { return g_nodes; }
const std::vector<std::string>& world_hosts() { return g_hosts; }

static double allreduce(double x, MPI_Op op) {
  YUAN_CHECK(g_initialized, "comm::allreduce before comm::init");
  Waiting wait(op == MPI_SUM ? "allreduce_sum" : "allreduce_max", "world");
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, op, MPI_COMM_WORLD));
  return x;
}
double allreduce_sum(double x) { return allreduce(x, MPI_SUM); }
double allreduce_max(double x) { return allreduce(x, MPI_MAX); }

std::vector<std::string> gather_strings(const std::string& mine) {
  const WorldInfo& w = world();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(w.size)), displs(static_cast<size_t>(w.size));
  Waiting wait("gather_strings", "world");
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  int total = 0;
  for (int r = 0; r < w.size; r++) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(static_cast<size_t>(w.rank == 0 ? total : 0), '\0');
  MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                        MPI_COMM_WORLD));
  std::vector<std::string> out;
  if (w.rank == 0)
    for (int r = 0; r < w.size; r++) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

std::vector<double> gather(double mine) { return gather(std::vector<double>{mine}, "gather"); }

std::vector<double> gather(const std::vector<double>& mine, const char* op) {
  const WorldInfo& w = world();
  const int n = static_cast<int>(mine.size());
  std::vector<double> all(w.rank == 0 ? mine.size() * static_cast<size_t>(w.size) : 0);
  Waiting wait(op, "world");
  MPI_CHECK(MPI_Gather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return all;
}

std::vector<double> broadcast(std::vector<double> v, int root, const char* op) {
  Waiting wait(op, "world", root);
  MPI_CHECK(MPI_Bcast(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, root, MPI_COMM_WORLD));
  return v;
}

void barrier_doing(const char* op, const std::function<void()>& meanwhile) {
  Waiting wait(op, "world");
  MPI_Request everyone;
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &everyone));
  for (int done = 0;;) {
    MPI_CHECK(MPI_Test(&everyone, &done, MPI_STATUS_IGNORE));
    if (done) return;
    meanwhile();
  }
}

static std::vector<unsigned long long> sum_over(MPI_Comm comm, const std::vector<unsigned long long>& values,
                                                const char* group, int* ranks) {
  std::vector<unsigned long long> sum(values.size());
  {
    Waiting wait("sum", group);
    MPI_CHECK(MPI_Allreduce(values.data(), sum.data(), static_cast<int>(values.size()), MPI_UNSIGNED_LONG_LONG,
                            MPI_SUM, comm));
  }
  MPI_CHECK(MPI_Comm_size(comm, ranks));
  return sum;
}

std::vector<unsigned long long> sum_on_node(const std::vector<unsigned long long>& values, const char* group,
                                            int* ranks) {
  return sum_over(g_node_comm, values, group, ranks);
}

std::vector<unsigned long long> sum_on_node(const std::vector<unsigned long long>& values, int color,
                                            const char* group, int* ranks) {
  MPI_Comm same;
  {
    Waiting wait("comm_split", "node");
    MPI_CHECK(MPI_Comm_split(g_node_comm, color, g_world.rank, &same));
  }
  std::vector<unsigned long long> sum = sum_over(same, values, group, ranks);
  MPI_CHECK(MPI_Comm_free(&same));
  return sum;
}

std::string broadcast_string(const std::string& s, int root) {
  unsigned long long len = s.size();
  Waiting wait("broadcast_string", "world");
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD));
  std::string out = s;
  out.resize(len);
  MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(len), MPI_CHAR, root, MPI_COMM_WORLD));
  return out;
}

std::string first_problem(const std::string& mine) {
  int first = mine.empty() ? INT_MAX : g_world.rank;
  {
    Waiting wait("first_problem", "world");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  }
  return first == INT_MAX ? std::string() : broadcast_string(mine, first);
}

void barrier() {
  YUAN_CHECK(g_initialized, "comm::barrier before comm::init");
  Waiting wait("barrier", "world");
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

// Every rank's `value`, in rank order, on every rank; `op` names the wait for the watchdog.
static std::vector<uint64_t> allgather(uint64_t value, const char* op) {
  std::vector<uint64_t> all(static_cast<size_t>(g_world.size));
  Waiting wait(op, "world");
  MPI_CHECK(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
  return all;
}

void check_same_everywhere(uint64_t value, const char* what) {
  YUAN_CHECK(g_initialized, "comm::check_same_everywhere(%s) before comm::init", what);
  const std::vector<uint64_t> all = allgather(value, "check_same_everywhere");
  for (int r = 1; r < g_world.size; r++) {
    if (all[r] == all[0]) continue;
    // Every rank sees the same gathered values, so every rank throws this same collective error.
    throw Error(strf("%s differs between ranks: rank %d@%s has %" PRIu64 ", rank 0@%s has %" PRIu64, what, r,
                     g_hosts[r].c_str(), all[r], g_hosts[0].c_str(), all[0]),
                true);
  }
}

void check_same_command(const char* command) {
  YUAN_CHECK(g_initialized, "comm::check_same_command before comm::init");
  constexpr int kLen = 32;  // longer than any command's name; a longer one is compared by its first 31 bytes
  char mine[kLen] = {};
  std::strncpy(mine, command, kLen - 1);
  std::vector<char> all(static_cast<size_t>(g_world.size) * kLen);
  {
    Waiting wait("check_same_command", "world");
    MPI_CHECK(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD));
  }
  for (int r = 1; r < g_world.size; r++) {
    const char* theirs = all.data() + static_cast<size_t>(r) * kLen;
    if (std::strcmp(theirs, all.data()) == 0) continue;
    throw Error(strf("the ranks run different commands: rank %d@%s runs 'yuanlm %s', rank 0@%s runs 'yuanlm %s'; "
                     "every rank of a job must run the same command (one mpirun/srun line per command)",
                     r, g_hosts[r].c_str(), theirs, g_hosts[0].c_str(), all.data()),
                true);
  }
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int agreed_stop_signal() {
  int sig = g_stop_signal.load();
  if (g_initialized && g_world.size > 1) {
    Waiting wait("agreed_stop_signal", "world");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  }
  // Every rank was there to agree: a peer that leaves from here on has checkpointed and exits.
  if (sig) note_ending();
  return sig;
}

int stop_signal_received() { return g_stop_signal.load(); }
void note_ending() { g_ending.store(true); }
bool ending() { return g_ending.load(); }
bool claim_last_line() {
  note_ending();
  return !g_last_line.exchange(true);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

int fail(const Error& e) {
  // Another thread is ending the process with its own line (a deadline, a lost node): one line per process.
  if (!claim_last_line())
    for (;;) pause();
  const bool lone = !e.collective() && g_initialized && g_world.size > 1;
  // A lone rank's error may be a peer's loss showing through (an MPI call that failed on a closed connection):
  // the ranks that do not answer then go into its line.
  std::string silent;
  if (lone && liveness_served()) {
    const std::vector<int> ranks = silent_ranks(kEndingPingSeconds);
    if (!ranks.empty()) silent = describe_silent(ranks, kEndingPingSeconds, g_nodes, g_hosts);
  }
  if (!e.collective() || process_rank() == 0)
    std::fprintf(stderr, "error: [rank %d@%s] %s%s\n", process_rank(), process_host().c_str(), e.what(),
                 silent.empty() ? "" : ("; " + silent).c_str());
  std::fflush(stderr);
  if (lone) {
    // The SIGTERM with which the launcher then ends the other ranks comes from this error, which has its line.
    announce_end();
    // A lone rank's error would leave the others blocked in their next collective: take the whole job down.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  finalize();
  return 1;
}

void check_same_text_everywhere(
    uint64_t hash, const std::string& text, const char* what,
    const std::function<std::string(const std::string&, const std::string&, const std::string&, const std::string&)>&
        describe) {
  YUAN_CHECK(g_initialized, "comm::check_same_text_everywhere(%s) before comm::init", what);
  const std::vector<uint64_t> all = allgather(hash, "check_same_text_everywhere");
  int r = 1;
  while (r < g_world.size && all[r] == all[0]) r++;
  if (r == g_world.size) return;
  // Every rank takes part in both broadcasts and words the same difference, so every rank throws the same error.
  const std::string root_text = broadcast_string(text, 0), odd_text = broadcast_string(text, r);
  const std::string root_name = strf("rank 0@%s", g_hosts[0].c_str());
  const std::string odd_name = strf("rank %d@%s", r, g_hosts[r].c_str());
  std::string why = describe(root_text, root_name, odd_text, odd_name);
  if (why.empty()) why = strf("%s has a different text than %s", odd_name.c_str(), root_name.c_str());
  throw Error(strf("%s differs between ranks: %s", what, why.c_str()), true);
}

}  // namespace yuan::comm
