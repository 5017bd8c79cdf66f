// Threads per rank. OMP_NUM_THREADS wins when set. Otherwise a rank that the launcher bound to cores uses
// those cores, and an unbound rank takes its share of the node (cores / ranks on the node), so that
// `mpirun -np 2` on a 2-core node never runs four spinning OpenMP threads. OpenBLAS gets the same count.
#pragma once

namespace yuan {
int configure_threads(int ranks_on_node);
}
