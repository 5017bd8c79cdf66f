// Who is silent. A collective that waits past the deadline (comm/watchdog.h) cannot tell which member keeps it
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

#include "layout/nodes.h"

namespace yuan::comm {

// How long a rank waits for the answers to its ping when the job is already ending: Open MPI's launcher follows its
// SIGTERM with SIGKILL a second later (odls_base_sigkill_timeout, 1 s), and a live rank's responder answers within
// its poll period (10 ms) plus the network.
constexpr double kEndingPingSeconds = 0.5;

// Starts the responder thread. Collective over MPI_COMM_WORLD (it duplicates it); needs MPI_THREAD_MULTIPLE and
// more than one rank, else it does nothing and liveness_served() stays false.
void serve_liveness();
// The service also watches for a SIGTERM (comm::stop_signal_received), from a thread that makes no MPI call
// until then: a launcher ending the job sends it to the ranks left when a node is lost, as for a plain stop. That
// thread then pings every rank for kEndingPingSeconds: when every rank answers it is a plain stop and nothing
// changes; when some do not and this process knows of no other reason for the end (comm::ending,
// announce_end), the lowest rank that answers writes the job's one line, naming them ("error: [rank 0@node1] the
// launcher is ending the job (SIGTERM): world ranks 2-3 on node2 do not answer a liveness ping within 0.5 s: node2
// is lost or cut off; ending"), and every rank that checked exits 1 without waiting for the launcher's SIGKILL.
//
// Stops and joins the responder and that thread (before MPI_Finalize).
void stop_liveness();
bool liveness_served();

// Pings every other world rank and returns, ascending, those that did not answer within `seconds`; returns by
// then even when MPI calls stay inside Open MPI after a node's loss (they run on threads of their own). Ignores
// SIGPIPE from then on.
std::vector<int> silent_ranks(double seconds);

// "world rank 3 on node2", "world ranks 2-3 on node2 and 6 on node3": ascending `ranks` with the host of each
// (hosts[r] for world rank r), consecutive ranks on one host as a range.
std::string describe_ranks(const std::vector<int>& ranks, const std::vector<std::string>& hosts);

// What `silent` (from silent_ranks(seconds), not empty) means, in words: "world ranks 2-3 on node2 do not answer
// a liveness ping within 0.5 s: node2 is lost or cut off" when every rank of their nodes is silent, else "...:
// stopped, dead or cut off". `nodes` and `hosts` as node_map() and world_hosts().
std::string describe_silent(const std::vector<int>& silent, double seconds, const layout::NodeMap& nodes,
                            const std::vector<std::string>& hosts);

// Tells every other rank that this one ends the job with a line of its own (an error on this rank alone), so that
// their check after the launcher's SIGTERM stays quiet. Waits at most a fifth of kEndingPingSeconds for the notes to
// leave; does nothing without the service.
void announce_end();

// Forks a watcher that, unless this process's parent ends first, kills the parent after `seconds` when the parent
// is an Open MPI launcher or its node daemon (mpirun, orted). Called as the job is being ended: an mpirun that
// cannot reach a lost node waits for it for ever, and so does the orted of a node cut off from mpirun. Under any
// other parent (srun's slurmstepd, a shell) it does nothing: the batch system ends its own steps.
void end_launcher_after(double seconds);

}  // namespace yuan::comm
