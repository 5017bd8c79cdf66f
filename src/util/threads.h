// Threads per rank. OMP_NUM_THREADS wins when set. Otherwise a rank that the launcher bound to cores uses
// those cores, and an unbound rank takes its share of the node (cores / ranks on the node), so that
// `mpirun -np 2` on a 2-core node never runs four spinning OpenMP threads. OpenBLAS gets the same count.
//
// Nothing here changes the environment once threads may run: setenv(3) may move the array of variables and free
// the old one while another thread's getenv(3) walks it (glibc), and MPI's threads read it (the PMIx progress
// thread's event callbacks call getenv). What OpenBLAS reads from the environment when it is loaded is set at the
// start of main, before MPI_Init and any thread (prepare_blas_environment); its thread count is given to it when
// it is loaded (src/ops/matmul.cpp), not through OPENBLAS_NUM_THREADS.
#pragma once

namespace yuan {
int configure_threads(int ranks_on_node);
// The count configure_threads chose, for OpenBLAS; 0 before it ran.
int blas_threads();
// Names the OpenBLAS kernel family this CPU supports in OPENBLAS_CORETYPE, unless the user named one: OpenBLAS
// reads it when it is loaded (src/ops/matmul.cpp says why). The first call sets it, later ones change nothing; the
// first must come before any thread starts (main calls it first thing; OpenBLAS's loader calls it too, for
// programs that did not).
void prepare_blas_environment();
}
