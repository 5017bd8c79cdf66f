#include "comm/ping_pong.h"

#include <algorithm>
#include <vector>

#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "comm/world.h"

namespace yuan::comm {

double round_trip(int a, int b, size_t bytes, double seconds) {
  const int rank = world().rank;
  if (rank != a && rank != b) return 0;
  Waiting wait("ping-pong", "world", rank == a ? b : a);
  std::vector<char> buf(std::max<size_t>(bytes, 1));
  const int n = static_cast<int>(bytes);
  constexpr int kGo = 1, kLast = 2;
  const MPI_Comm comm = MPI_COMM_WORLD;
  if (rank == a) {
    MPI_CHECK(MPI_Send(buf.data(), 0, MPI_CHAR, b, kGo, comm));  // lines b up: the clock starts once it answers
    MPI_CHECK(MPI_Recv(buf.data(), 0, MPI_CHAR, b, 0, comm, MPI_STATUS_IGNORE));
    long trips = 0;
    const double t0 = MPI_Wtime();
    for (bool last = false; !last; trips++) {
      last = trips >= 3 && MPI_Wtime() - t0 >= seconds;
      MPI_CHECK(MPI_Send(buf.data(), n, MPI_CHAR, b, last ? kLast : kGo, comm));
      MPI_CHECK(MPI_Recv(buf.data(), n, MPI_CHAR, b, 0, comm, MPI_STATUS_IGNORE));
    }
    return (MPI_Wtime() - t0) / static_cast<double>(trips);
  }
  MPI_CHECK(MPI_Recv(buf.data(), 0, MPI_CHAR, a, kGo, comm, MPI_STATUS_IGNORE));
  MPI_CHECK(MPI_Send(buf.data(), 0, MPI_CHAR, a, 0, comm));
  for (MPI_Status st{}; st.MPI_TAG != kLast;) {
    MPI_CHECK(MPI_Recv(buf.data(), n, MPI_CHAR, a, MPI_ANY_TAG, comm, &st));
    MPI_CHECK(MPI_Send(buf.data(), n, MPI_CHAR, a, 0, comm));
  }
  return 0;
}

PingPong ping_pong(int a, int b, size_t small, size_t large, double seconds) {
  PingPong p{1e30, 0};
  for (int round = 0; round < kPingPongRounds; round++) {
    p.latency_s = std::min(p.latency_s, round_trip(a, b, small, seconds / kPingPongRounds) / 2);
    const double trip = round_trip(a, b, large, seconds / kPingPongRounds);
    if (trip > 0) p.bandwidth = std::max(p.bandwidth, static_cast<double>(large) * 2 / trip);
  }
  return world().rank == a ? p : PingPong{};
}

}  // namespace yuan::comm
