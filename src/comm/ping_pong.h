// The MPI link between two ranks, measured by ping-pong: what `yuanlm plan --calibrate` (planner/calibrate.h) writes
// into a machine file and tools/bench/bench_pingpong.cpp prints.
#pragma once
#include <cstddef>

namespace yuan::comm {

// Seconds per round trip of `bytes` between world ranks `a` and `b` (a sends, b answers), for about `seconds` after
// a first exchange that lines the two up: a decides when to stop and tells b in the tag of its last message. The
// time is a's; b and the ranks outside the pair return 0 (the others at once).
double round_trip(int a, int b, size_t bytes, double seconds);

// What a ping-pong between a and b says of their link: latency is half the round trip of a `small` message,
// bandwidth the bytes per second of `large` ones each way; each the best of kPingPongRounds rounds sharing `seconds`
// (a rank that another process kept off its core for a while makes a slow round, not a slow link). Valid on rank a.
struct PingPong {
  double latency_s = 0, bandwidth = 0;
};
constexpr int kPingPongRounds = 5;
PingPong ping_pong(int a, int b, size_t small, size_t large, double seconds);

}  // namespace yuan::comm
