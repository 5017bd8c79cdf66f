// The MPI control plane: rendezvous, who-am-I, small host-side agreements (scalars, config hash) and ending
// the job. Tensor traffic goes through a Communicator (comm/communicator.h).
#pragma once
#include <cstddef>
#include <exception>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "layout/nodes.h"
#include "util/error.h"

namespace yuan::comm {

struct WorldInfo {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // within the node (MPI_COMM_TYPE_SHARED)
  int node = 0;                        // the node's index in node_map()
  std::string host = "localhost";      // this rank's processor name
  bool thread_multiple = false;  // MPI may be called from several threads at once (MPI_THREAD_MULTIPLE)
};

// MPI_Init_thread, asking for MULTIPLE and accepting FUNNELED; sets the process identity for messages.
void init(int* argc, char*** argv);

// A deadline for start-up's waits, which run before the watchdog does: MPI_Init (its PMIx fence waits for every
// rank: PMIxTimeout, 300 s by default, under srun; for ever under mpirun) and the first collectives over the world.
// A node lost while the job starts would otherwise leave the ranks that did start waiting. Past the deadline
// (YUANLM_START_TIMEOUT_S seconds, default the watchdog's kDefaultTimeoutSeconds) the process writes one line and
// exits 1, which ends the job under mpirun and srun. One scope at a time; SIGALRM is its own while it lasts.
class StartupDeadline {
 public:
  StartupDeadline();
  ~StartupDeadline();
  StartupDeadline(const StartupDeadline&) = delete;
  StartupDeadline& operator=(const StartupDeadline&) = delete;
};
void finalize();
bool initialized();
const WorldInfo& world();
// Every rank's node, gathered once by init(): a node is a shared-memory domain (MPI_COMM_TYPE_SHARED), named after
// the processor name of its lowest rank, so that the ranks of one node agree on it.
const layout::NodeMap& node_map();
const std::vector<std::string>& world_hosts();  // the processor name of each world rank, by rank

double allreduce_sum(double x);
double allreduce_max(double x);
void barrier();
// Small host-side exchanges for checkpoint bookkeeping (file names, checksums).
std::vector<std::string> gather_strings(const std::string& mine);  // rank 0: every rank's, in rank order
std::vector<double> gather(double mine);                           // rank 0: every rank's, in rank order
// Rank 0: every rank's `mine` (as many on every rank), one after the other in rank order; the others: empty. `op`
// names the wait to the watchdog.
std::vector<double> gather(const std::vector<double>& mine, const char* op);
std::string broadcast_string(const std::string& s, int root);
// Root's `v` (as many on every rank), on every rank; `op` names the wait.
std::vector<double> broadcast(std::vector<double> v, int root, const char* op);
// A barrier over the world that calls `meanwhile` until every rank has reached it; `op` names the wait.
void barrier_doing(const char* op, const std::function<void()>& meanwhile);
// Collective over this rank's node: the sum of `values` over the node's ranks, and how many they are (`ranks`);
// with a `color`, over those of them that pass the same one (every rank of the node takes part). `group` names the
// ranks summed over to the watchdog.
std::vector<unsigned long long> sum_on_node(const std::vector<unsigned long long>& values, const char* group,
                                            int* ranks);
std::vector<unsigned long long> sum_on_node(const std::vector<unsigned long long>& values, int color,
                                            const char* group, int* ranks);
// The non-empty `mine` of the lowest rank that has one, on every rank ("" when none has): one rank's problem, which
// every rank then reports, so that all end with the same collective error.
std::string first_problem(const std::string& mine);
// Runs `check` on every rank; where it throws on any, every rank throws the lowest failing rank's message as one
// collective Error, which main() prints once before all ranks exit (without it each rank printed its own line and
// the first took the job down with MPI_Abort). `check` must hold no collective: a failing rank leaves it early.
template <class F>
void refuse_together(F&& check) {
  std::string mine;
  try {
    check();
  } catch (const std::exception& e) {
    mine = e.what();
    if (mine.empty()) mine = "failed without a message";
  }
  const std::string problem = first_problem(mine);
  if (!problem.empty()) throw Error(problem, true);
}
// Throws Error naming the first rank whose value differs from rank 0's.
void check_same_everywhere(uint64_t value, const char* what);

// Refuses, collectively, a job whose ranks run different subcommands (an MPMD launch such as `mpirun -np 1 yuanlm
// train : -np 1 yuanlm eval`), which would otherwise wait in each other's collectives for ever.
void check_same_command(const char* command);

// Stop signals: SLURM sends SIGUSR1 (--signal=USR1@120) before the time limit and SIGTERM at it; mpirun forwards
// SIGUSR1. install_stop_handlers() (at the very start of main, before MPI and any work, for the commands that act
// on them) makes them set a flag instead of ending the process; agreed_stop_signal() is collective: the signal
// any rank received (0: none), the same on every rank, so that all stop at the same point.
void install_stop_handlers();
int agreed_stop_signal();
const char* signal_name(int sig);  // "SIGTERM", "SIGUSR1"
// The stop signal this process has received (0: none), before any agreement: the liveness service
// (comm/liveness.h) checks on a SIGTERM whether the launcher is ending the job over a lost node.
int stop_signal_received();

// Ending the job. A launcher ends a job by sending SIGTERM to the ranks left, whatever the reason; a rank that gets
// one while a peer is silent names that peer, unless this process already knows why the job ends and has said or
// will say so: note_ending() marks that (a stop every rank agreed on, MPI_Finalize begun), ending() asks.
void note_ending();
bool ending();
// The job's last line from this process: the first caller (an error, a deadline, the liveness check after a
// SIGTERM) gets true, writes its line and ends the process; a later caller, on another thread at the same moment,
// gets false and must not write a second line (the first ends the process).
bool claim_last_line();

// Ends the whole job after `e`: prints "error: [rank R@host] msg" (collective errors on rank 0 only) and
// returns the exit code for main(). Non-collective errors abort every rank through MPI_Abort.
int fail(const Error& e);

// check_same_everywhere() for a text, with the difference put in words: when a rank's `hash` (of its `text`)
// differs from rank 0's, every rank throws the same collective Error, "WHAT differs between ranks: " followed by
// describe(rank 0's text, "rank 0@host", the first differing rank's text, "rank R@host"). The texts travel only
// when the hashes differ.
void check_same_text_everywhere(
    uint64_t hash, const std::string& text, const char* what,
    const std::function<std::string(const std::string&, const std::string&, const std::string&, const std::string&)>&
        describe);

}  // namespace yuan::comm
