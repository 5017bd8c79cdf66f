// Who is silent (comm/liveness.h), the longest wait a job rode out and a thread's time waited
// (comm/watchdog.h). Under mpirun
// (Mpi*): every serving rank answers a ping, and a rank whose responder has stopped is named by every other rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "comm/liveness.h"
#include "comm/watchdog.h"
#include "comm/world.h"

namespace yuan::comm {
namespace {

using layout::NodeMap;

TEST(Liveness, DescribeRanksGroupsRunsByHost) {
  const std::vector<std::string> hosts = {"node1", "node1", "node2", "node2", "node3", "node3", "node3"};
  EXPECT_EQ(describe_ranks({3}, hosts), "world rank 3 on node2");
  EXPECT_EQ(describe_ranks({2, 3}, hosts), "world ranks 2-3 on node2");
  // A run stops at a node's end, and the runs of one node share its name.
  EXPECT_EQ(describe_ranks({1, 2, 3}, hosts), "world ranks 1 on node1 and 2-3 on node2");
  EXPECT_EQ(describe_ranks({0, 4, 6}, hosts), "world ranks 0 on node1 and 4, 6 on node3");
  EXPECT_EQ(describe_ranks({0, 2, 3, 5}, hosts), "world ranks 0 on node1, 2-3 on node2 and 5 on node3");
}

TEST(Liveness, DescribeSilentNamesANodeOnlyWhenAllItsRanksAreSilent) {
  const std::vector<std::string> hosts = {"node1", "node1", "node2", "node2", "node3", "node3"};
  const NodeMap nodes = NodeMap::from_leaders({0, 0, 2, 2, 4, 4}, hosts);
  EXPECT_EQ(describe_silent({2, 3}, 0.5, nodes, hosts),
            "world ranks 2-3 on node2 do not answer a liveness ping within 0.5 s: node2 is lost or cut off");
  EXPECT_EQ(describe_silent({2, 3, 4, 5}, 0.5, nodes, hosts),
            "world ranks 2-3 on node2 and 4-5 on node3 do not answer a liveness ping within 0.5 s: node2 and node3 "
            "are lost or cut off");
  // A node with a rank that answers is not lost: its silent rank is.
  EXPECT_EQ(describe_silent({3}, 2, nodes, hosts),
            "world rank 3 on node2 does not answer a liveness ping within 2 s: stopped, dead or cut off");
  EXPECT_EQ(describe_silent({2, 3, 5}, 2, nodes, hosts),
            "world ranks 2-3 on node2 and 5 on node3 do not answer a liveness ping within 2 s: stopped, dead or cut "
            "off");
}

TEST(Liveness, LongestWaitAndTimeWaitedAreTakenOnce) {
  take_longest_wait();  // whatever earlier tests waited
  take_waited_seconds();
  {
    Waiting w("short_op", "short_group");
  }
  {
    Waiting w("long_op", "long_group");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const LongestWait first = take_longest_wait();
  EXPECT_GE(first.seconds, 0.03);
  EXPECT_STREQ(first.op, "long_op");
  EXPECT_STREQ(first.group, "long_group");
  EXPECT_EQ(take_longest_wait().seconds, 0);
  EXPECT_GE(take_waited_seconds(), 0.03);  // both waits, on this thread
  EXPECT_EQ(take_waited_seconds(), 0);
}

TEST(MpiLiveness, LiveRanksAnswerAndAStoppedResponderIsNamed) {
  if (world().size == 1 || !world().thread_multiple) GTEST_SKIP() << "needs 2+ ranks and MPI_THREAD_MULTIPLE";
  serve_liveness();
  ASSERT_TRUE(liveness_served());
  EXPECT_TRUE(silent_ranks(5).empty());
  barrier();
  // The last rank stops answering: every other rank names it, and only it.
  const int last = world().size - 1;
  if (world().rank == last) stop_liveness();
  barrier();
  if (world().rank != last) {
    EXPECT_EQ(silent_ranks(1), std::vector<int>{last});
  }
  barrier();
  stop_liveness();
}

}  // namespace
}  // namespace yuan::comm
