// `yuanlm plan --calibrate --out FILE`: this machine measured, as a machine file that `plan --machine` reads
// (planner/machine.h). Alone, one rank measures its node's compute and memory; under mpirun every rank runs the same
// measurements at once on all nodes (the node's figure is the sum over its ranks, and the machine's the slowest
// node's: the step waits for it), and pairs of ranks measure the MPI links by ping-pong: two ranks of one node
// (shared memory), and, launched over several nodes, rank 0 and the first rank of the next node (the network),
// with comm/ping_pong.h.
#pragma once
#include <string>

namespace yuan::planner {

// The measurements on every rank of the world, and the machine file written by rank 0 to `out` (atomically).
// Throws a collective Error naming `out` before measuring anything when it cannot be written.
void calibrate(const std::string& out);

}  // namespace yuan::planner
