// The link between two ranks as MPI sees it: half the round-trip time of a small message (latency) and the
// bytes per second of large ones sent back and forth (bandwidth), each the best of a few rounds, between ranks 0
// and 1 of whatever mpirun placed: on one node (shared memory) or on two (the network). tools/bench/bench_nodes.sh
// runs it over the same path as its training job, as the limit that job's gradient exchange meets. Ranks other than
// 0 and 1 wait.
//   mpirun -np 2 bin/bench_pingpong [--small 8] [--large 4194304] [--seconds 2]
// The method is comm::ping_pong's, the same that `yuanlm plan --calibrate` measures a machine's links with.
#include <boost/program_options.hpp>
#include <cstdio>

#include "comm/ping_pong.h"
#include "comm/world.h"

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
  yuan::comm::init(&argc, &argv);
  const yuan::comm::WorldInfo& w = yuan::comm::world();
  if (w.size < 2) {
    std::fprintf(stderr, "error: bench_pingpong needs 2 ranks (mpirun -np 2), not %d\n", w.size);
    yuan::comm::finalize();
    return 2;
  }
  yuan::comm::barrier();
  const yuan::comm::PingPong p = yuan::comm::ping_pong(0, 1, small, large, seconds);
  if (w.rank == 0)
    std::printf("pingpong %s <-> %s: latency %.1f us (%zu B, half a round trip), bandwidth %.1f MB/s (%zu B each way)\n",
                w.host.c_str(), yuan::comm::world_hosts()[1].c_str(), p.latency_s * 1e6, small, p.bandwidth / 1e6,
                large);
  yuan::comm::finalize();
  return 0;
}
