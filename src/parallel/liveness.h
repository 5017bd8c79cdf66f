// Who is silent. A collective that waits past the deadline (parallel/watchdog.h) cannot tell which member keeps it
// waiting, and on a cluster the answer is what the user needs: which node died, was cut off or holds a stopped
// rank. Every rank answers pings on a duplicate of MPI_COMM_WORLD from a thread of its own, so a live rank answers
// while its main thread computes or waits; a rank that is stopped (SIGSTOP), dead, or on the far side of a
// network partition cannot. The watchdog pings every rank when a wait runs out and names those that do not answer.
//
// Past the deadline the job must end even where MPI cannot end it: a rank whose MPI_Abort cannot reach its
// launcher (mpirun on the far side of a partition) is ended by an alarm, and the launcher's daemon on its node
// (orted), which would wait for the lost mpirun for ever, by a watcher process (end_launcher_after).
#pragma once
#include <string>
#include <vector>

namespace yuan::parallel {

// Starts the responder thread. Collective over MPI_COMM_WORLD (it duplicates it); needs MPI_THREAD_MULTIPLE and
// more than one rank, else it does nothing and liveness_served() stays false.
void serve_liveness();
// Stops and joins the responder (before MPI_Finalize).
void stop_liveness();
bool liveness_served();

// Pings every other world rank and returns, ascending, those that did not answer within `seconds`.
std::vector<int> silent_ranks(double seconds);

// "world rank 3 on node2", "world ranks 2-3 on node2 and 6 on node3": ascending `ranks` with the host of each
// (hosts[r] for world rank r), consecutive ranks on one host as a range.
std::string describe_ranks(const std::vector<int>& ranks, const std::vector<std::string>& hosts);

// Forks a watcher that, unless this process's parent ends first, kills the parent after `seconds` when the parent
// is an Open MPI launcher or its node daemon (mpirun, orted). Called as the job is being ended: an mpirun that
// cannot reach a lost node waits for it for ever, and so does the orted of a node cut off from mpirun. Under any
// other parent (srun's slurmstepd, a shell) it does nothing: the batch system ends its own steps.
void end_launcher_after(double seconds);

}  // namespace yuan::parallel
