// The link between two ranks as MPI sees it: half the round-trip time of a small message (latency) and the
// bytes per second of large ones sent back and forth (bandwidth), each the best of a few rounds, between ranks 0
// and 1 of whatever mpirun placed: on one node (shared memory) or on two (the network). tools/bench/bench_nodes.sh
// runs it over the same path as its training job, as the limit that job's gradient exchange meets. Ranks other than
// 0 and 1 wait.
//   mpirun -np 2 bin/bench_pingpong [--small 8] [--large 4194304] [--seconds 2]
// The method is planner::ping_pong's, the same that `yuanlm plan --calibrate` measures a machine's links with.
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>

#include "planner/calibrate.h"

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  size_t small = 8, large = 4 << 20;
  double seconds = 2;
  po::options_description opts("bench_pingpong");
  opts.add_options()("small", po::value(&small), "bytes of the latency message")(
      "large", po::value(&large), "bytes of the bandwidth message")("seconds", po::value(&seconds),
                                                                     "seconds per measurement");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, len = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char host[MPI_MAX_PROCESSOR_NAME] = {}, peer[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Get_processor_name(host, &len);
  if (size < 2) {
    std::fprintf(stderr, "error: bench_pingpong needs 2 ranks (mpirun -np 2), not %d\n", size);
    MPI_Finalize();
    return 2;
  }
  if (rank == 1) MPI_Send(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
  if (rank == 0) MPI_Recv(peer, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
  const yuan::planner::PingPong p = yuan::planner::ping_pong(MPI_COMM_WORLD, 0, 1, small, large, seconds);
  if (rank == 0)
    std::printf("pingpong %s <-> %s: latency %.1f us (%zu B, half a round trip), bandwidth %.1f MB/s (%zu B each way)\n",
                host, peer, p.latency_s * 1e6, small, p.bandwidth / 1e6, large);
  MPI_Finalize();
  return 0;
}
