// The planner: machine files (parser errors, round trip), the alpha-beta collectives, the schedule simulation,
// and the layout search against memory.
#include <gtest/gtest.h>

#include <string>

#include "planner/machine.h"
#include "util/error.h"

using namespace yuan;
using namespace yuan::planner;

namespace {

const char* kMachine = R"(# a test node
[machine]
name = test node
devices_per_node = 4  # source: test

[device]
kind = cuda
peak_flops = 100e12  # source: test
gemm_efficiency = 0.5  # source: test
gemm_half_flops = 1e9  # source: test
mem_bw = 1e12  # measured: test
mem_bytes = 16e9  # source: test
pcie_bw = 10e9  # source: test

[host]
mem_bytes = 256e9  # source: test
mem_bw = 100e9  # source: test
cores = 32  # source: test

[link.intra]
latency_s = 2e-6  # source: test
bandwidth = 100e9  # source: test

[link.inter]
latency_s = 10e-6  # source: test
bandwidth = 10e9  # source: test
)";

// The error parse_machine gives for kMachine with `from` replaced by `to` ("" when it parses).
std::string error_with(const std::string& from, const std::string& to) {
  std::string text = kMachine;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  try {
    parse_machine(text, "m.ini");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PlannerMachine, Parses) {
  MachineSources sources;
  const Machine m = parse_machine(kMachine, "m.ini", &sources);
  EXPECT_EQ(m.name, "test node");
  EXPECT_EQ(m.devices_per_node, 4);
  EXPECT_EQ(m.kind, "cuda");
  EXPECT_DOUBLE_EQ(m.peak_flops, 100e12);
  EXPECT_DOUBLE_EQ(m.gemm_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(m.mem_bw, 1e12);
  EXPECT_DOUBLE_EQ(m.host_mem_bytes, 256e9);
  EXPECT_EQ(m.host_cores, 32);
  EXPECT_DOUBLE_EQ(m.intra.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(m.inter.bandwidth, 10e9);
  EXPECT_EQ(sources.at("device.mem_bw"), "measured: test");
  EXPECT_EQ(sources.at("link.inter.bandwidth"), "source: test");
}

TEST(PlannerMachine, RoundTrips) {
  MachineSources sources;
  const Machine m = parse_machine(kMachine, "m.ini", &sources);
  const std::string text = machine_text(m, sources);
  MachineSources again;
  const Machine n = parse_machine(text, "again.ini", &again);
  EXPECT_EQ(machine_text(n, again), text);
  EXPECT_EQ(again, sources);
  EXPECT_EQ(n.devices_per_node, m.devices_per_node);
  EXPECT_EQ(n.gemm_half_flops, m.gemm_half_flops);
  EXPECT_EQ(n.intra.latency_s, m.intra.latency_s);
  // A number without a source cannot be written.
  sources.erase("host.mem_bw");
  EXPECT_THROW(machine_text(m, sources), Error);
}

TEST(PlannerMachine, ErrorsNameFileLineAndKey) {
  EXPECT_EQ(error_with("", ""), "");
  EXPECT_EQ(error_with("mem_bw = 1e12", "mem_bandwidth = 1e12"), "m.ini:11: key 'device.mem_bandwidth': unknown key");
  EXPECT_EQ(error_with("100e12", "100 TFLOPS"), "m.ini:8: key 'device.peak_flops': '100 TFLOPS' is not a number");
  EXPECT_NE(error_with("mem_bytes = 16e9  # source: test", "mem_bytes = 16e9").find(
                "m.ini:12: key 'device.mem_bytes': the number has no '# source: ...'"),
            std::string::npos);
  EXPECT_EQ(error_with("0.5  # source", "1.5  # source"), "m.ini:9: key 'device.gemm_efficiency': 1.5 must be a "
            "fraction, at most 1");
  EXPECT_EQ(error_with("kind = cuda", "kind = tpu"), "m.ini:7: key 'device.kind': 'tpu' is not cpu or cuda");
  EXPECT_EQ(error_with("cores = 32", "cores = 3.5"), "m.ini:18: key 'host.cores': 3.5 must be a whole number");
  EXPECT_EQ(error_with("[host]", "[hots]"), "m.ini:15: unknown section [hots] (expected [machine], [device], "
            "[host], [link.intra] or [link.inter])");
  EXPECT_EQ(error_with("latency_s = 10e-6  # source: test\n", ""), "m.ini: key 'link.inter.latency_s' missing");
  EXPECT_EQ(error_with("cores = 32  # source: test", "cores = 32  # source: test\nmem_bw = 1  # source: x"),
            "m.ini:19: key 'host.mem_bw' given twice");
  EXPECT_EQ(error_with("bandwidth = 10e9", "bandwidth = 0"), "m.ini:26: key 'link.inter.bandwidth': 0 must be "
            "positive");
  EXPECT_EQ(error_with("mem_bytes = 16e9", "mem_bytes = 0"), "m.ini: key 'device.mem_bytes' must be positive for "
            "a cuda device");
  EXPECT_THROW(read_machine("/nonexistent/machine.ini"), Error);
}

TEST(PlannerMachine, ShippedFilesParse) {
  for (const char* f : {"input/machines/h100-sxm.ini", "input/machines/a100.ini", "input/machines/v100.ini"}) {
    SCOPED_TRACE(f);
    const Machine m = read_machine(f);
    EXPECT_EQ(m.kind, "cuda");
    EXPECT_EQ(m.devices_per_node, 8);
  }
  const Machine cpu = read_machine("input/machines/cpu.ini");
  EXPECT_TRUE(cpu.cpu());
  EXPECT_EQ(cpu.mem_bytes, 0);
}
