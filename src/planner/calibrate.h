// `yuanlm plan --calibrate --out FILE`: this machine measured, as a machine file that `plan --machine` reads
// (planner/machine.h). Alone, one rank measures its node's compute and memory; under mpirun every rank runs the same
// measurements at once on all nodes (the node's figure is the sum over its ranks, and the machine's the slowest
// node's: the step waits for it), and pairs of ranks measure the MPI links by ping-pong: two ranks of one node
// (shared memory), and, launched over several nodes, rank 0 and the first rank of the next node (the network).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>

namespace yuan::planner {

// Seconds per round trip of `bytes` between ranks `a` and `b` of `comm` (a sends, b answers), for about `seconds`
// after a first exchange that lines the two up: a decides when to stop and tells b in the tag of its last message.
// The time is a's; b and the ranks outside the pair return 0 (the others at once). tools/bench/bench_pingpong.cpp
// measures the links with it too.
double round_trip(MPI_Comm comm, int a, int b, size_t bytes, double seconds);

// What a ping-pong between a and b says of their link: latency is half the round trip of a `small` message,
// bandwidth the bytes per second of `large` ones each way; each the best of kPingPongRounds rounds sharing `seconds`
// (a rank that another process kept off its core for a while makes a slow round, not a slow link). Valid on rank a.
struct PingPong {
  double latency_s = 0, bandwidth = 0;
};
constexpr int kPingPongRounds = 5;
PingPong ping_pong(MPI_Comm comm, int a, int b, size_t small, size_t large, double seconds);

// The measurements on every rank of the world, and the machine file written by rank 0 to `out` (atomically).
// Throws a collective Error naming `out` before measuring anything when it cannot be written.
void calibrate(const std::string& out);

}  // namespace yuan::planner
