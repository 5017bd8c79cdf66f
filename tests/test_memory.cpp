// The node's available memory (MemAvailable against cgroup v1 and v2 limits, over a fake /proc and /sys tree) and
// allocations that fail with what they were for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "util/error.h"
#include "util/memory.h"

namespace fs = std::filesystem;
using yuan::node_available_memory;

namespace {

class NodeMemoryTest : public testing::Test {
 protected:
  void SetUp() override {
    unsetenv("YUANLM_NODE_MEMORY");
    root_ = fs::temp_directory_path() / ("yuanlm-node-memory-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    write("proc/meminfo", "MemTotal:       8000000 kB\nMemFree:        100 kB\nMemAvailable:    4194304 kB\n");
  }
  void TearDown() override {
    fs::remove_all(root_);
    unsetenv("YUANLM_NODE_MEMORY");
  }
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  yuan::NodeMemory read() const { return node_available_memory(root_.string()); }
  static constexpr size_t kMiB = size_t{1} << 20;
  fs::path root_;
};

TEST_F(NodeMemoryTest, MemAvailableWithoutCgroupLimits) {
  write("proc/self/cgroup", "0::/\n");
  const yuan::NodeMemory m = read();
  EXPECT_EQ(m.available, 4096 * kMiB);
  EXPECT_EQ(m.source, "MemAvailable");
}

TEST_F(NodeMemoryTest, CgroupV2LimitLessUsageButNotInactiveFileCache) {
  write("proc/self/cgroup", "0::/slurm/job_7\n");
  write("sys/fs/cgroup/slurm/job_7/memory.max", std::to_string(1024 * kMiB) + "\n");
  write("sys/fs/cgroup/slurm/job_7/memory.current", std::to_string(300 * kMiB) + "\n");
  write("sys/fs/cgroup/slurm/job_7/memory.stat", "anon 1\ninactive_file " + std::to_string(100 * kMiB) + "\n");
  const yuan::NodeMemory m = read();
  EXPECT_EQ(m.available, 824 * kMiB);
  EXPECT_EQ(m.source, "cgroup /slurm/job_7 (v2)");
}

TEST_F(NodeMemoryTest, CgroupV2TighterAncestorAndUnlimitedLevels) {
  write("proc/self/cgroup", "0::/slurm/job_7\n");
  write("sys/fs/cgroup/slurm/job_7/memory.max", "max\n");
  write("sys/fs/cgroup/slurm/job_7/memory.current", "0\n");
  write("sys/fs/cgroup/slurm/memory.max", std::to_string(512 * kMiB) + "\n");
  write("sys/fs/cgroup/slurm/memory.current", std::to_string(12 * kMiB) + "\n");
  EXPECT_EQ(read().available, 500 * kMiB);
}

TEST_F(NodeMemoryTest, CgroupV1LimitAndItsNoLimitValue) {
  write("proc/self/cgroup", "5:cpu,cpuacct:/a\n4:memory:/job\n0::/\n");
  write("sys/fs/cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/fs/cgroup/memory/job/memory.usage_in_bytes", std::to_string(100 * kMiB) + "\n");
  EXPECT_EQ(read().source, "MemAvailable");  // no limit
  write("sys/fs/cgroup/memory/job/memory.limit_in_bytes", std::to_string(2048 * kMiB) + "\n");
  write("sys/fs/cgroup/memory/job/memory.stat", "cache 5\ntotal_inactive_file " + std::to_string(50 * kMiB) + "\n");
  const yuan::NodeMemory m = read();
  EXPECT_EQ(m.available, 1998 * kMiB);
  EXPECT_EQ(m.source, "cgroup /job (v1)");
}

TEST_F(NodeMemoryTest, MemAvailableWhenSmallerThanTheCgroupRoom) {
  write("proc/self/cgroup", "0::/big\n");
  write("sys/fs/cgroup/big/memory.max", std::to_string(64 * 1024 * kMiB) + "\n");
  write("sys/fs/cgroup/big/memory.current", "0\n");
  EXPECT_EQ(read().source, "MemAvailable");
}

TEST_F(NodeMemoryTest, TestHookReplacesTheReadingAndRejectsNonsense) {
  setenv("YUANLM_NODE_MEMORY", "1.5G", 1);
  const yuan::NodeMemory m = read();
  EXPECT_EQ(m.available, 1536 * kMiB);
  EXPECT_EQ(m.source, "YUANLM_NODE_MEMORY");
  for (const char* bad : {"", "lots", "3X", "-1G"}) {
    setenv("YUANLM_NODE_MEMORY", bad, 1);
    EXPECT_THROW(read(), yuan::Error) << bad;
  }
}

TEST(HostAllocation, FailureNamesWhatAndHowMuch) {
  try {
    yuan::HostArray<char> a(size_t{1} << 62, yuan::Mem::Optimizer);
    FAIL() << "a 4 EiB allocation succeeded";
  } catch (const yuan::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("out of host memory: 4294967296.00 GiB of optimizer state"), 0u) << msg;
  }
  std::vector<float> v;
  try {
    yuan::allocating(sizeof(float) << 60, "test weights", [&] { v.resize(size_t{1} << 60); });
    FAIL() << "a 4 EiB vector was allocated";
  } catch (const yuan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB of test weights"), std::string::npos) << e.what();
  }
}

}  // namespace
