// The planner: machine files (parser errors, round trip), the alpha-beta collectives, the schedule simulation,
// and the layout search against memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "layout/elastic.h"
#include "layout/schedule.h"
#include "model/gpt.h"
#include "ops/op_cost.h"
#include "planner/machine.h"
#include "planner/replan.h"
#include "planner/search.h"
#include "planner/step_model.h"
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
attention_efficiency = 0.25  # source: test
mem_efficiency = 0.8  # source: test
launch_s = 1e-6  # source: test
sm_count = 8  # source: test
sustained_clock = 0.9  # source: test

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
  EXPECT_DOUBLE_EQ(m.attention_efficiency, 0.25);
  EXPECT_DOUBLE_EQ(m.mem_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(m.launch_s, 1e-6);
  EXPECT_EQ(m.sm_count, 8);
  EXPECT_DOUBLE_EQ(m.sustained_clock, 0.9);
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
  EXPECT_EQ(error_with("cores = 32", "cores = 3.5"), "m.ini:23: key 'host.cores': 3.5 must be a whole number");
  EXPECT_EQ(error_with("[host]", "[hots]"), "m.ini:20: unknown section [hots] (expected [machine], [device], "
            "[host], [link.intra] or [link.inter])");
  EXPECT_EQ(error_with("latency_s = 10e-6  # source: test\n", ""), "m.ini: key 'link.inter.latency_s' missing");
  EXPECT_EQ(error_with("cores = 32  # source: test", "cores = 32  # source: test\nmem_bw = 1  # source: x"),
            "m.ini:24: key 'host.mem_bw' given twice");
  EXPECT_EQ(error_with("bandwidth = 10e9", "bandwidth = 0"), "m.ini:31: key 'link.inter.bandwidth': 0 must be "
            "positive");
  EXPECT_EQ(error_with("mem_bytes = 16e9", "mem_bytes = 0"), "m.ini: key 'device.mem_bytes' must be positive for "
            "a cuda device");
  EXPECT_EQ(error_with("mem_efficiency = 0.8", "mem_efficiency = 1.2"), "m.ini:15: key 'device.mem_efficiency': 1.2 "
            "must be a fraction, at most 1");
  // What the cuda kernels and the GPU reach must be stated for a cuda machine.
  EXPECT_EQ(error_with("attention_efficiency = 0.25  # source: test\n", ""), "m.ini: key "
            "'device.attention_efficiency' missing");
  EXPECT_EQ(error_with("sm_count = 8  # source: test\n", ""), "m.ini: key 'device.sm_count' missing");
  EXPECT_EQ(error_with("sustained_clock = 0.9", "sustained_clock = 1.1"), "m.ini:18: key 'device.sustained_clock': "
            "1.1 must be a fraction, at most 1");
  EXPECT_THROW(read_machine("/nonexistent/machine.ini"), Error);
}

TEST(PlannerMachine, CpuLeavesOutTheCudaKernelKeys) {
  // A cpu machine (what `plan --calibrate` writes) may leave out the cuda kernels' and the GPU's keys: they take the
  // neutral values (attention at peak_flops, memory-bound ops at mem_bw, no launch gap, no waves of GEMM tiles, the
  // clock peak_flops was measured at), and the writer leaves them out too.
  std::string text = kMachine;
  text.replace(text.find("kind = cuda"), 11, "kind = cpu");
  for (const char* key : {"attention_efficiency = 0.25  # source: test\n", "mem_efficiency = 0.8  # source: test\n",
                          "launch_s = 1e-6  # source: test\n", "sm_count = 8  # source: test\n",
                          "sustained_clock = 0.9  # source: test\n"})
    text.erase(text.find(key), std::string(key).size());
  MachineSources sources;
  const Machine m = parse_machine(text, "cpu.ini", &sources);
  EXPECT_EQ(m.attention_efficiency, 1);
  EXPECT_EQ(m.mem_efficiency, 1);
  EXPECT_EQ(m.launch_s, 0);
  EXPECT_EQ(m.sm_count, 0);
  EXPECT_EQ(m.sustained_clock, 1);
  const std::string written = machine_text(m, sources);
  EXPECT_EQ(written.find("mem_efficiency"), std::string::npos) << written;
  EXPECT_EQ(machine_text(parse_machine(written, "again.ini"), sources), written);
}

TEST(PlannerMachine, CpuLoopKeysAreOptional) {
  // The cpu loops' rates may be left out of any machine (0: not measured); given, they read back and are written.
  const Machine none = parse_machine(kMachine, "m.ini");
  EXPECT_EQ(none.attention_flops, 0);
  EXPECT_EQ(none.gelu_rate, 0);
  EXPECT_EQ(none.softmax_rate, 0);
  std::string text = kMachine;
  text.insert(text.find("mem_bytes"), "attention_flops = 9e9  # measured: test\ngelu_rate = 7e7  # measured: test\n"
              "softmax_rate = 1.2e8  # measured: test\n");
  MachineSources sources;
  const Machine m = parse_machine(text, "m.ini", &sources);
  EXPECT_EQ(m.attention_flops, 9e9);
  EXPECT_EQ(m.gelu_rate, 7e7);
  EXPECT_EQ(m.softmax_rate, 1.2e8);
  const std::string written = machine_text(m, sources);
  EXPECT_NE(written.find("gelu_rate        = 7e+07  # measured: test"), std::string::npos) << written;
  EXPECT_EQ(parse_machine(written, "again.ini").softmax_rate, 1.2e8);
  std::string unsourced = text;
  unsourced.replace(unsourced.find("gelu_rate = 7e7  # measured: test"), 33, "gelu_rate = 7e7");
  EXPECT_THROW(parse_machine(unsourced, "m.ini"), Error);
}

TEST(PlannerMachine, NodesPerHostIsOptional) {
  // One node a host when left out; given (as --calibrate writes it where nodes share a host), it reads back and is
  // written; it must be a whole number of at least one.
  EXPECT_EQ(parse_machine(kMachine, "m.ini").nodes_per_host, 1);
  std::string text = kMachine;
  text.insert(text.find("\n[device]"), "nodes_per_host = 2  # measured: test\n");
  MachineSources sources;
  const Machine m = parse_machine(text, "m.ini", &sources);
  EXPECT_EQ(m.nodes_per_host, 2);
  const std::string written = machine_text(m, sources);
  EXPECT_NE(written.find("nodes_per_host   = 2  # measured: test"), std::string::npos) << written;
  EXPECT_EQ(parse_machine(written, "again.ini").nodes_per_host, 2);
  MachineSources plain;
  const Machine one = parse_machine(kMachine, "m.ini", &plain);
  EXPECT_EQ(machine_text(one, plain).find("nodes_per_host"), std::string::npos);
  std::string zero = text;
  zero.replace(zero.find("nodes_per_host = 2"), 18, "nodes_per_host = 0");
  try {
    parse_machine(zero, "m.ini");
    ADD_FAILURE() << "nodes_per_host = 0 taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.ini:5: key 'machine.nodes_per_host': 0 must be positive"),
              std::string::npos)
        << e.what();
  }
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
  // cuDNN's fused attention: on sm_80 and newer, not on the V100 (sm_70) nor the cpu.
  EXPECT_EQ(read_machine("input/machines/h100-sxm.ini").cudnn_attention_efficiency, 0.64);
  EXPECT_GT(read_machine("input/machines/a100.ini").cudnn_attention_efficiency, 0);
  EXPECT_EQ(read_machine("input/machines/v100.ini").cudnn_attention_efficiency, 0);
  EXPECT_EQ(cpu.cudnn_attention_efficiency, 0);
}

TEST(PlannerMachine, CudnnAttentionEfficiencyIsOptional) {
  // 0 (cuDNN's attention does not run there) when left out, and not written back; given, a fraction of peak.
  MachineSources plain;
  const Machine none = parse_machine(kMachine, "m.ini", &plain);
  EXPECT_EQ(none.cudnn_attention_efficiency, 0);
  EXPECT_EQ(machine_text(none, plain).find("cudnn_attention_efficiency"), std::string::npos);
  std::string text = kMachine;
  text.insert(text.find("mem_efficiency"), "cudnn_attention_efficiency = 0.5  # source: test\n");
  MachineSources sources;
  const Machine m = parse_machine(text, "m.ini", &sources);
  EXPECT_EQ(m.cudnn_attention_efficiency, 0.5);
  EXPECT_EQ(parse_machine(machine_text(m, sources), "again.ini").cudnn_attention_efficiency, 0.5);
  EXPECT_NE(error_with("mem_efficiency = 0.8", "cudnn_attention_efficiency = 1.5  # source: test\nmem_efficiency = 0.8")
                .find("must be a fraction"),
            std::string::npos);
}

TEST(PlannerCollectives, AlphaBeta) {
  const LinkClass link{1e-5, 1e9};
  const double n = 8e6;
  // Ring: D-1 steps of n/D each way; all-reduce is a reduce-scatter then an all-gather.
  EXPECT_DOUBLE_EQ(collective_s(Collective::AllGather, n, 4, link), 3 * 1e-5 + 0.75 * n / 1e9);
  EXPECT_DOUBLE_EQ(collective_s(Collective::ReduceScatter, n, 4, link), 3 * 1e-5 + 0.75 * n / 1e9);
  EXPECT_DOUBLE_EQ(collective_s(Collective::AllReduce, n, 4, link), 2 * (3 * 1e-5 + 0.75 * n / 1e9));
  EXPECT_DOUBLE_EQ(collective_s(Collective::SendRecv, n, 2, link), 1e-5 + n / 1e9);
  // Small messages over many ranks go up and down a tree: 2 log2(D) latencies instead of 2 (D-1).
  EXPECT_DOUBLE_EQ(collective_s(Collective::AllReduce, 8, 64, link), 2 * 6 * 1e-5 + 2 * 8 / 1e9);
  EXPECT_EQ(collective_s(Collective::AllReduce, n, 1, link), 0);
}

TEST(PlannerSchedule, BubbleOfEqualStages) {
  // With equal stages and free sends, both schedules idle (p-1)/(m+p-1) of the step on every stage.
  for (auto kind : {yuan::layout::ScheduleKind::OneFOneB, yuan::layout::ScheduleKind::GPipe})
    for (int p : {1, 2, 4, 5})
      for (int m : {1, 3, 8}) {
        SCOPED_TRACE(testing::Message() << yuan::layout::schedule_name(kind) << " p " << p << " m " << m);
        StageTimes t;
        t.forward.compute = 1;
        t.backward.compute = 1.5;
        t.backward.comm = 0.5;
        const Simulation sim = simulate(kind, std::vector<StageTimes>(p, t), m);
        EXPECT_NEAR(sim.makespan, (m + p - 1) * 3.0, 1e-9);
        for (double busy : sim.busy) EXPECT_NEAR(1 - busy / sim.makespan, (p - 1.0) / (m + p - 1), 1e-9);
      }
}

TEST(PlannerSchedule, SendsAndSlowStages) {
  StageTimes t;
  t.forward.compute = 1;
  t.backward.compute = 2;
  t.send_s = 0.25;
  // Two stages, one micro-batch: F0, send, F1, B1, send back, B0.
  Simulation sim = simulate(yuan::layout::ScheduleKind::OneFOneB, {t, t}, 1);
  EXPECT_DOUBLE_EQ(sim.makespan, 1 + 0.25 + 1 + 2 + 0.25 + 2);
  // The slowest stage sets the pace: m micro-batches through a stage of 3 + 6 take it at least 9 m.
  StageTimes slow = t;
  slow.forward.compute = 3;
  slow.backward.compute = 6;
  sim = simulate(yuan::layout::ScheduleKind::OneFOneB, {t, slow, t}, 8);
  EXPECT_GE(sim.makespan, 8 * 9.0);
  EXPECT_DOUBLE_EQ(sim.busy[1], 8 * 9.0);
}

TEST(PlannerSimulate, RanksSharingCoresFillTheBubble) {
  // Two stages of one pipeline on one host. On 2 cores each stage has its own: the schedule is as without sharing,
  // its bubble idle. On 1 core a stage waiting for its input yields the core to the other, which computes at the
  // full rate meanwhile: the core never idles, and the step is the two stages' work end to end. The even share the
  // model gave before (each at half rate throughout) would take twice the 2-core schedule.
  StageTimes t;
  t.forward.compute = 1;
  t.backward.compute = 2;
  const int m = 4;
  const auto kind = yuan::layout::ScheduleKind::OneFOneB;
  const SharedPipeline both{{t, t}, {{{0, 1}}, {{0, 1}}}, m};
  const Simulation alone = simulate(kind, {t, t}, m);
  const Simulation two_cores = simulate(kind, {both}, {CorePool{2, 1}}).front();
  EXPECT_DOUBLE_EQ(two_cores.makespan, alone.makespan);
  EXPECT_DOUBLE_EQ(alone.makespan, (m + 1) * 3.0);
  const Simulation one_core = simulate(kind, {both}, {CorePool{1, 1}}).front();
  EXPECT_NEAR(one_core.makespan, 2 * m * 3.0, 1e-9);
  EXPECT_LT(one_core.makespan, 2 * alone.makespan);
  // Each stage's passes stretch while the other computes too: busy more than its work, less than twice it.
  for (double busy : one_core.busy) {
    EXPECT_GT(busy, m * 3.0 + 1e-9);
    EXPECT_LT(busy, 2 * m * 3.0);
  }
  // A pass's communication takes its own time, not the core's: with one, the other stage computes through it.
  StageTimes talking = t;
  talking.backward.comm = 0.5;
  const Simulation with_comm =
      simulate(kind, {SharedPipeline{{talking, talking}, {{{0, 1}}, {{0, 1}}}, m}}, {CorePool{1, 1}}).front();
  EXPECT_LT(with_comm.makespan, one_core.makespan + 2 * m * 0.5);
  // Two pipelines on hosts of their own run as each would alone; on one host of 2 cores (2 threads a rank) they
  // share it: each at half rate while both compute, the later one at the full rate once the other is done.
  const SharedPipeline host0{{t}, {{{0, 1}}}, 2}, host1{{t}, {{{1, 1}}}, 3};
  const std::vector<Simulation> apart = simulate(kind, {host0, host1}, {CorePool{2, 2}, CorePool{2, 2}});
  EXPECT_DOUBLE_EQ(apart[0].makespan, 2 * 3.0);
  EXPECT_DOUBLE_EQ(apart[1].makespan, 3 * 3.0);
  const SharedPipeline same1{{t}, {{{0, 1}}}, 3};
  const std::vector<Simulation> together = simulate(kind, {host0, same1}, {CorePool{2, 2}});
  EXPECT_NEAR(together[0].makespan, 2 * 2 * 3.0, 1e-9);
  EXPECT_NEAR(together[1].makespan, 2 * 2 * 3.0 + 3.0, 1e-9);
}

namespace {

// The tiny deck's model on the dev VM's cpu node, with `host_gib` of host memory per node.
Machine cpu_node(double host_gib) {
  Machine m = parse_machine(kMachine, "m.ini");
  m.kind = "cpu";
  m.devices_per_node = 2;
  m.mem_bytes = m.pcie_bw = 0;
  m.attention_efficiency = m.mem_efficiency = 1;  // the cuda kernels' keys as a cpu file leaves them
  m.launch_s = 0;
  m.host_mem_bytes = host_gib * (1 << 30);
  return m;
}

Config tiny_deck() {
  Config c;
  c.model = {4, 4, 128, 128, 4000};
  c.train.micro_batch = 8;
  c.train.global_batch = 16;
  c.train.device = "cpu";
  c.data.train = "data/none/train_*.h5";  // named, never read
  return c;
}

}  // namespace

TEST(PlannerSearch, RespectsMemoryAndRanksByTokens) {
  const Config deck = tiny_deck();
  const Search roomy = search_layouts(deck, 2, 2, cpu_node(64));
  ASSERT_GT(roomy.fitting.size(), 10u);
  EXPECT_TRUE(roomy.rejected.empty());
  for (size_t i = 1; i < roomy.fitting.size(); i++)
    EXPECT_GE(roomy.fitting[i - 1].prediction.tokens_per_s, roomy.fitting[i].prediction.tokens_per_s);
  // Data x tensor x pipelines (heterogeneous too) x micro-batch x ZeRO x recompute x schedule.
  bool tensor = false, pipeline = false, mixed = false, zero3 = false, recompute = false, gpipe = false;
  for (const Candidate& c : roomy.fitting) {
    tensor |= c.config.parallel.tp_size > 1;
    pipeline |= !c.config.parallel.pipelines.empty();
    mixed |= c.config.parallel.templates.size() > 1;
    zero3 |= c.config.optim.zero.shards_weights();
    recompute |= c.config.train.recompute;
    gpipe |= c.config.parallel.schedule == "gpipe";
    // The cpu backend's optimizer is in host memory, which is its device's: one placement.
    EXPECT_EQ(c.config.optim.offload, Offload::Host) << c.layout;
  }
  EXPECT_TRUE(tensor && pipeline && mixed && zero3 && recompute && gpipe);
  // A node of between the smallest and the largest need: what fits is within it, and what does not is over.
  double least = 1e300, most = 0;
  for (const Candidate& c : roomy.fitting) {
    least = std::min(least, c.prediction.host_bytes);
    most = std::max(most, c.prediction.host_bytes);
  }
  ASSERT_LT(least, most);
  const Machine tight = cpu_node((least + most) / 2 / (1 << 30));
  const Search squeezed = search_layouts(deck, 2, 2, tight);
  ASSERT_FALSE(squeezed.fitting.empty());
  ASSERT_FALSE(squeezed.rejected.empty());
  EXPECT_EQ(squeezed.fitting.size() + squeezed.rejected.size(), roomy.fitting.size());
  for (const Candidate& c : squeezed.fitting) EXPECT_LE(c.prediction.host_bytes, tight.host_mem_bytes);
  for (const Candidate& c : squeezed.rejected) {
    EXPECT_GT(c.prediction.host_bytes, tight.host_mem_bytes);
    EXPECT_NE(c.prediction.short_of.find("host memory: node"), std::string::npos) << c.prediction.short_of;
  }
}

TEST(PlannerSearch, OverridesRunTheLayout) {
  // The overrides a candidate prints, applied to the deck as `yuanlm train DECK ...` applies them, give the
  // layout that was predicted: the same prediction.
  // On the cuda machine the optimizer's placement is one of the overrides.
  const Config deck = tiny_deck();
  const std::string path = testing::TempDir() + "planner_deck.ini";
  std::ofstream(path) << deck.to_ini();
  for (const Machine& m : {cpu_node(64), parse_machine(kMachine, "m.ini")}) {
    const Search found = search_layouts(deck, 2, 2, m);
    for (size_t i = 0; i < found.fitting.size(); i++) {
      const Candidate& c = found.fitting[i];
      SCOPED_TRACE(m.kind + ": " + c.layout);
      std::vector<std::string> args = {path};
      args.insert(args.end(), c.overrides.begin(), c.overrides.end());
      Config applied;
      ASSERT_TRUE(parse_config(args, "train", applied));
      EXPECT_EQ(applied.to_ini(), c.config.to_ini());
      EXPECT_DOUBLE_EQ(predict(applied, c.world, 2, m).step_s, c.prediction.step_s);
    }
  }
}

TEST(PlannerSearch, RanksBothPlacementsWhereTheDeviceHoldsTheState) {
  // On a cuda machine every layout, ZeRO 3's too, comes twice, the optimizer state on the devices (optim.offload =
  // none) and on the host; each candidate says which, in its layout, its overrides and its prediction. Where both
  // fit, the state on the device is faster (no PCIe, HBM instead of the host's memory): it ranks above its twin,
  // and first.
  Config deck = tiny_deck();
  deck.train.device = "cuda";
  Machine m = parse_machine(kMachine, "m.ini");
  const Search roomy = search_layouts(deck, 1, 4, m);
  ASSERT_FALSE(roomy.fitting.empty());
  EXPECT_TRUE(roomy.rejected.empty());
  std::map<std::string, std::map<Offload, const Candidate*>> twins;  // by the layout less its placement
  for (const Candidate& c : roomy.fitting) {
    SCOPED_TRACE(c.layout);
    const Offload offload = c.config.optim.offload;
    ASSERT_TRUE(offload == Offload::None || offload == Offload::Host);
    EXPECT_EQ(c.prediction.offload, offload);
    const std::string flag = offload == Offload::None ? "--optim.offload=none" : "--optim.offload=host";
    EXPECT_NE(std::find(c.overrides.begin(), c.overrides.end(), flag), c.overrides.end());
    const std::string where = offload == Offload::None ? ", optimizer on the device" : ", optimizer on the host";
    const size_t at = c.layout.find(where);
    ASSERT_NE(at, std::string::npos);
    EXPECT_EQ(c.prediction.device_optimizer_bytes > 0, offload == Offload::None);
    twins[c.layout.substr(0, at) + c.layout.substr(at + where.size())][offload] = &c;
  }
  EXPECT_EQ(roomy.fitting.front().config.optim.offload, Offload::None);
  size_t pairs = 0, zero3_pairs = 0;
  for (const auto& [layout, by] : twins) {
    SCOPED_TRACE(layout);
    ASSERT_EQ(by.size(), 2u);
    zero3_pairs += by.begin()->second->config.optim.zero.shards_weights();
    const Prediction &none = by.at(Offload::None)->prediction, &host = by.at(Offload::Host)->prediction;
    EXPECT_GT(none.tokens_per_s, host.tokens_per_s);
    EXPECT_GT(none.device_bytes, host.device_bytes);
    pairs++;
  }
  EXPECT_GT(pairs, 10u);
  EXPECT_GT(zero3_pairs, 0u);
  // A device as small as the least any layout needs with the state on the host: no layout fits with the state on
  // it, so every candidate that fits keeps the state on the host, and every one that puts it on the device is
  // rejected for the device's memory.
  m.mem_bytes = 1e300;
  for (const Candidate& c : roomy.fitting)
    if (c.config.optim.offload == Offload::Host) m.mem_bytes = std::min(m.mem_bytes, c.prediction.device_bytes);
  const Search small = search_layouts(deck, 1, 4, m);
  ASSERT_FALSE(small.fitting.empty());
  for (const Candidate& c : small.fitting) EXPECT_EQ(c.config.optim.offload, Offload::Host) << c.layout;
  size_t refused = 0;
  for (const Candidate& c : small.rejected)
    if (c.config.optim.offload == Offload::None) {
      refused++;
      EXPECT_EQ(c.prediction.short_of.rfind("device memory: rank ", 0), 0u) << c.prediction.short_of;
    }
  EXPECT_EQ(refused, pairs);
}

TEST(PlannerPredict, CpuRanksShareTheNode) {
  // Two ranks on one cpu node share its GEMM rate: each computes at half speed, so the same micro-batches per rank
  // take twice as long as one rank alone on its node.
  Config c = tiny_deck();
  c.train.global_batch = 16;
  const Machine m = cpu_node(64);
  const Prediction shared = predict(c, 2, 2, m), alone = predict(c, 2, 1, m);
  EXPECT_NEAR(shared.split.compute, 2 * alone.split.compute, 1e-9 * shared.split.compute);
  EXPECT_TRUE(shared.fits);
  EXPECT_GT(shared.tokens_per_s, 0);
  EXPECT_NEAR(shared.split.compute + shared.split.comm + shared.split.bubble + shared.split.optimizer,
              shared.step_s, 1e-9 * shared.step_s);
}

TEST(PlannerPredict, PipelinesSharingCoresFillTheBubble) {
  // On a cpu node of one core (one thread a rank) a 2-stage pipeline's waiting stage yields the core to the other:
  // the step is about the data-parallel pair's (the same work in micro-batches of the same size), less than the
  // bubble over it. On 2 cores each stage has its own core and the bubble shows.
  Config dp = tiny_deck();
  dp.train.micro_batch = 4;
  Config pp = dp;
  pp.parallel.templates = {"p:auto:2"};
  pp.parallel.pipelines = "p";
  pp.parallel.microbatches = "p:4";
  pp.train.micro_batch = 4;
  for (int cores : {1, 2}) {
    SCOPED_TRACE(testing::Message() << cores << " cores");
    Machine m = cpu_node(64);
    m.host_cores = cores;
    m.peak_flops = 1e9 * cores;  // the node's rate with all its cores: each core the same
    m.gemm_half_flops = 1;       // every GEMM at the same rate
    const Prediction d = predict(dp, 2, 2, m), p = predict(pp, 2, 2, m);
    EXPECT_NEAR(p.split.compute + p.split.comm + p.split.bubble + p.split.optimizer, p.step_s, 1e-9 * p.step_s);
    if (cores == 1) {
      EXPECT_LT(p.step_s, 1.1 * d.step_s);
    } else {
      EXPECT_GT(p.step_s, 1.15 * d.step_s);
    }
  }
}

TEST(PlannerPredict, NodesSharingAHost) {
  // The test cluster's nodes run on one host: with nodes_per_host 2, 2 nodes of 2 ranks share the host's cores
  // (its rate, the [device] figures) as 4 ranks on one node of it would, twice as slow as 2 nodes of their own;
  // and the host's memory holds the ranks of both.
  Config c = tiny_deck();
  c.train.micro_batch = 2;
  c.train.global_batch = 16;
  Machine own = cpu_node(64);
  own.host_cores = 2;
  Machine shared = own;
  shared.nodes_per_host = 2;
  const Prediction apart = predict(c, 4, 2, own), together = predict(c, 4, 2, shared), one = predict(c, 4, 4, own);
  EXPECT_NEAR(together.split.compute, 2 * apart.split.compute, 1e-9 * together.split.compute);
  EXPECT_NEAR(together.split.compute, one.split.compute, 1e-9 * together.split.compute);
  EXPECT_NEAR(together.host_bytes, 2 * apart.host_bytes, 1e-9 * together.host_bytes);
  EXPECT_NEAR(together.mfu, 2 * apart.mfu * together.tokens_per_s / apart.tokens_per_s, 1e-9);
  shared.host_mem_bytes = 1.5 * apart.host_bytes;
  const Prediction short_of = predict(c, 4, 2, shared);
  EXPECT_FALSE(short_of.fits);
  EXPECT_NE(short_of.short_of.find("host memory: host 0 (nodes 0-1)'s ranks"), std::string::npos)
      << short_of.short_of;
}

TEST(PlannerPredict, GroupsAcrossNodesRunAtTheInterLink) {
  // Tensor-parallel pairs inside a node talk over [link.intra]; with one rank per node the same pairs cross nodes
  // and their all-reduces run at [link.inter] (10 times slower in kMachine, with 5 times the latency).
  Config c = tiny_deck();
  c.parallel.tp_size = 2;
  Machine m = cpu_node(64);
  m.peak_flops = 1e15;  // compute aside, so that the split is the links'
  const Prediction inside = predict(c, 2, 2, m), across = predict(c, 2, 1, m);
  EXPECT_GT(inside.split.comm, 0);
  EXPECT_GT(across.split.comm, 5 * inside.split.comm);
  // The delayed update runs the host AdamW beside the next step's passes: what shows of it shrinks.
  c.parallel.tp_size = 1;
  Config delayed = c;
  delayed.optim.delayed_update = true;
  EXPECT_LT(predict(delayed, 2, 2, m).split.optimizer, predict(c, 2, 2, m).split.optimizer);
}

TEST(PlannerCollectives, GroupLinks) {
  const Machine m = parse_machine(kMachine, "m.ini");  // 4 per node; intra 100e9, inter 10e9 per rank
  EXPECT_EQ(group_link(m, {0, 1, 2, 3}, 4).bandwidth, 100e9);
  EXPECT_EQ(group_link(m, {0, 1, 2, 3}, 4).latency_s, 2e-6);
  // One member per node: that rank's share of the ports.
  EXPECT_EQ(group_link(m, {0, 4, 8}, 4).bandwidth, 10e9);
  EXPECT_EQ(group_link(m, {0, 4, 8}, 4).latency_s, 10e-6);
  // Two members on every node share two ranks' ports; the node with fewest members sets the pace.
  EXPECT_EQ(group_link(m, {0, 1, 4, 5}, 4).bandwidth, 20e9);
  EXPECT_EQ(group_link(m, {0, 1, 2, 4}, 4).bandwidth, 10e9);
  // Whole nodes: all their ports; but never faster than inside a node.
  EXPECT_EQ(group_link(m, {0, 1, 2, 3, 4, 5, 6, 7}, 4).bandwidth, 40e9);
  Machine wide = m;
  wide.intra.bandwidth = 30e9;
  EXPECT_EQ(group_link(wide, {0, 1, 2, 3, 4, 5, 6, 7}, 4).bandwidth, 30e9);
}

TEST(PlannerCollectives, CpuNodesShareOnePort) {
  // A cpu node's ranks reach other nodes through its one interface (MPI over TCP): however many of a group's
  // members a node holds, their crossing runs at [link.inter]'s bandwidth.
  const Machine m = cpu_node(64);
  EXPECT_EQ(group_link(m, {0, 4, 8}, 4).bandwidth, 10e9);
  EXPECT_EQ(group_link(m, {0, 1, 4, 5}, 4).bandwidth, 10e9);
  EXPECT_EQ(group_link(m, {0, 1, 2, 3, 4, 5, 6, 7}, 4).bandwidth, 10e9);
  EXPECT_EQ(group_link(m, {0, 1, 2, 3}, 4).bandwidth, 100e9);
}

TEST(PlannerPredict, CpuRanksMoveTheirOwnBytes) {
  // On a cpu host the ranks copy their messages' bytes with their own cores: 4 data-parallel ranks reducing at once
  // on 2 cores get half a link each, twice the bandwidth term of 4 cores; with a core a rank, the link as measured.
  Config c = tiny_deck();
  c.train.micro_batch = 4;
  Machine m = cpu_node(64);
  m.intra.latency_s = 0;  // the bandwidth term alone
  m.host_cores = 4;
  const double own = predict(c, 4, 4, m).split.comm;
  m.host_cores = 2;
  EXPECT_NEAR(predict(c, 4, 4, m).split.comm, 2 * own, 1e-9 * own);
  m.host_cores = 8;
  EXPECT_NEAR(predict(c, 4, 4, m).split.comm, own, 1e-9 * own);
}

TEST(PlannerPredict, CudaKernelInputs) {
  // The inputs of the cuda kernels' rates, each moving the compute by what it prices: a block's 7 forward and 17
  // backward kernel launches, and its attention's 2 + 7 GEMM-like products (causal 2 N T C FLOPs each pair) at
  // attention_efficiency x peak at the sustained clock.
  Config c = tiny_deck();
  c.train.device = "cuda";
  const Machine m = parse_machine(kMachine, "m.ini");
  const double micro = 2, blocks = c.model.n_layer, N = c.train.micro_batch * c.model.seq_len;
  const Prediction base = predict(c, 1, 1, m);
  Machine launching = m;
  launching.launch_s = 1e-3;
  EXPECT_NEAR(predict(c, 1, 1, launching).split.compute - base.split.compute, micro * blocks * 24 * (1e-3 - m.launch_s),
              1e-9);
  Machine slow = m;
  slow.attention_efficiency = m.attention_efficiency / 2;
  const double attention_s = micro * blocks * 4.5 * 2 * N * c.model.seq_len * c.model.n_embd /
                             (m.peak_flops * m.sustained_clock * m.attention_efficiency);
  EXPECT_NEAR(predict(c, 1, 1, slow).split.compute - base.split.compute, attention_s, 1e-9 * attention_s);
  Machine streaming = m;
  streaming.mem_efficiency = 1;
  EXPECT_LT(predict(c, 1, 1, streaming).split.compute, base.split.compute);
}

TEST(PlannerPredict, AttentionChargedOnThePathTheRunTakes) {
  // model.attention as the run resolves it on the machine's device: auto takes cuDNN's fused attention where the
  // build and the head size allow it and the machine gives cudnn_attention_efficiency, charged at that (its backward
  // five products, 3.5 causal in all); own, or a machine without the key, at attention_efficiency (seven, 4.5).
  Config c = tiny_deck();
  c.train.device = "cuda";
  const int hs = c.model.n_embd / c.model.n_head;
  Machine without = parse_machine(kMachine, "m.ini");
  Machine with = without;
  with.cudnn_attention_efficiency = 0.5;
  const double micro = 2, blocks = c.model.n_layer, N = c.train.micro_batch * c.model.seq_len;
  const double causal = 2 * N * c.model.seq_len * c.model.n_embd, peak = with.peak_flops * with.sustained_clock;
  // The compute added by halving `efficiency` of `m`: the attention's time at it.
  const auto attention_s = [&](Machine m, double Machine::*efficiency) {
    const double base = predict(c, 1, 1, m).split.compute;
    m.*efficiency /= 2;
    return predict(c, 1, 1, m).split.compute - base;
  };
  const double own_s = micro * blocks * 4.5 * causal / (peak * with.attention_efficiency);
  c.model.attention = AttentionKernels::Own;
  EXPECT_EQ(attention_charge(c, with).path, AttentionPath::Own);
  EXPECT_EQ(attention_charge(c, with).efficiency, with.attention_efficiency);
  EXPECT_NEAR(attention_s(with, &Machine::attention_efficiency), own_s, 1e-9 * own_s);
  EXPECT_EQ(attention_s(with, &Machine::cudnn_attention_efficiency), 0);
  c.model.attention = AttentionKernels::Auto;
  const AttentionCharge on_without = attention_charge(c, without, "m.ini");
  EXPECT_EQ(on_without.path, AttentionPath::Own);
  EXPECT_EQ(on_without.efficiency, without.attention_efficiency);
  EXPECT_NEAR(attention_s(without, &Machine::attention_efficiency), own_s, 1e-9 * own_s);
  // model.attention = cudnn where the machine file has no cuDNN: refused, naming the file and the key.
  c.model.attention = AttentionKernels::Cudnn;
  try {
    attention_charge(c, without, "input/machines/m.ini");
    ADD_FAILURE() << "model.attention = cudnn planned on a machine without cuDNN's attention";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input/machines/m.ini"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudnn_attention_efficiency"), std::string::npos) << e.what();
  }
  EXPECT_THROW(predict(c, 1, 1, without), Error);
  c.model.attention = AttentionKernels::Auto;
  if (choose_attention(Device::Cuda, std::nullopt, hs, 2048).path != AttentionPath::Cudnn)
    GTEST_SKIP() << "this build runs no cuDNN attention: " << choose_attention(Device::Cuda, std::nullopt, hs, 2048).why;
  EXPECT_NE(on_without.why.find("m.ini gives no cudnn_attention_efficiency"), std::string::npos) << on_without.why;
  const AttentionCharge on_with = attention_charge(c, with);
  EXPECT_EQ(on_with.path, AttentionPath::Cudnn);
  EXPECT_EQ(on_with.efficiency, with.cudnn_attention_efficiency);
  const double cudnn_s = micro * blocks * 3.5 * causal / (peak * with.cudnn_attention_efficiency);
  EXPECT_NEAR(attention_s(with, &Machine::cudnn_attention_efficiency), cudnn_s, 1e-9 * cudnn_s);
  EXPECT_EQ(attention_s(with, &Machine::attention_efficiency), 0);
}

TEST(PlannerPredict, CpuLoopRates) {
  // On a cpu node the measured loops price what they measure: halving a rate adds the op's time at that rate once.
  // Attention: 3 x 2 B heads T^2 hs causal FLOPs (forward and backward) a block; GELU: one pass each way over
  // N x 4C a block; the classifier: N x V logits. A cuda machine leaves them unused.
  Config c = tiny_deck();
  Machine m = cpu_node(64);
  m.attention_flops = 8e9;
  m.gelu_rate = 6e7;
  m.softmax_rate = 1.2e8;
  const double micro = 2, blocks = c.model.n_layer, B = c.train.micro_batch, T = c.model.seq_len, C = c.model.n_embd;
  const double N = B * T, hs = C / c.model.n_head;
  const double base = predict(c, 1, 1, m).split.compute;
  const auto slower = [&](double Machine::*rate) {
    Machine half = m;
    half.*rate /= 2;
    return predict(c, 1, 1, half).split.compute - base;
  };
  const double attention_s = micro * blocks * 3 * 2 * B * c.model.n_head * T * T * hs / m.attention_flops;
  EXPECT_NEAR(slower(&Machine::attention_flops), attention_s, 1e-9 * attention_s);
  const double gelu_s = micro * blocks * 2 * N * 4 * C / m.gelu_rate;
  EXPECT_NEAR(slower(&Machine::gelu_rate), gelu_s, 1e-9 * gelu_s);
  const double softmax_s = micro * N * c.model.vocab_size / m.softmax_rate;
  EXPECT_NEAR(slower(&Machine::softmax_rate), softmax_s, 1e-9 * softmax_s);
  // Not measured (0): attention at the GEMM rate, GELU and softmax at bandwidth, faster here than their loops.
  Machine unmeasured = m;
  unmeasured.attention_flops = unmeasured.gelu_rate = unmeasured.softmax_rate = 0;
  EXPECT_LT(predict(c, 1, 1, unmeasured).split.compute, base);
  c.train.device = "cuda";
  Machine gpu = parse_machine(kMachine, "m.ini");
  const double gpu_base = predict(c, 1, 1, gpu).step_s;
  gpu.attention_flops = gpu.gelu_rate = gpu.softmax_rate = 1;
  EXPECT_EQ(predict(c, 1, 1, gpu).step_s, gpu_base);
}

TEST(PlannerPredict, ZeroTwoSumsEveryMicroBatchOnTheHost) {
  // At zero 2 with overlap every micro-batch's reduced part lands on the host and is added into the gradient (12
  // bytes per shard element at host_mem_bw) beside the step's gradient-norm pass and AdamW (4 + 28 + 2 bytes per
  // element on cuda); PCIe aside, 4 micro-batches add 3 x 12 bytes to the 1 micro-batch's 34. Zero 1 reduces once
  // per step: no change. With the state on the device zero 2 reduces as zero 1 does, once per step (the backend
  // holds the whole gradient below zero 3): the same step as zero 1's.
  Machine m = parse_machine(kMachine, "m.ini");
  m.pcie_bw = 1e30;
  for (int zero : {1, 2}) {
    Config c = tiny_deck();
    c.train.device = "cuda";
    c.optim.zero = ZeroStage(zero);
    c.optim.offload = Offload::Host;
    const double one = predict(c, 2, 2, m).split.optimizer;
    c.train.micro_batch = 2;
    const double four = predict(c, 2, 2, m).split.optimizer;
    EXPECT_NEAR((four - one) / one, zero == 2 ? 36.0 / 34 : 0, 1e-9) << "zero " << zero;
  }
  Config c = tiny_deck();
  c.train.device = "cuda";
  c.train.micro_batch = 2;
  c.optim.offload = Offload::None;
  c.optim.zero = ZeroStage(1);
  const double zero1 = predict(c, 2, 2, m).step_s;
  c.optim.zero = ZeroStage(2);
  EXPECT_DOUBLE_EQ(predict(c, 2, 2, m).step_s, zero1);
}

TEST(PlannerPredict, TheOptimizerOnTheDeviceIsTheGpuAdamW) {
  // One rank at zero 0: its shard is the whole model, n parameters. optim.offload = none: the GPU AdamW (reads the
  // fp32 gradient, master, m and v, writes the last three and the bf16 weight: op_cost.h adamw_cost, 30 bytes an
  // element) and the gradient norm's read (grad_norm_cost, 4) at mem_efficiency x mem_bw, nothing over PCIe; with
  // the delayed update 8 bytes more (the gradient copied aside), none of it hidden. host: the same bytes at
  // host_mem_bw, the gradient down (4 bytes) and the bf16 weight up (2) at pcie_bw.
  Config c = tiny_deck();
  c.train.device = "cuda";
  c.optim.zero = ZeroStage(0);
  Machine m = parse_machine(kMachine, "m.ini");
  const double n = static_cast<double>(ParamLayout(c.model).total()), hbm = m.mem_bw * m.mem_efficiency;
  EXPECT_DOUBLE_EQ(ops::adamw_cost(n, 2).bytes + ops::grad_norm_cost(n).bytes, 34 * n);
  c.optim.offload = Offload::None;
  const Prediction none = predict(c, 1, 1, m);
  EXPECT_EQ(none.offload, Offload::None);
  EXPECT_NEAR(none.split.optimizer, (ops::adamw_cost(n, 2).bytes + ops::grad_norm_cost(n).bytes) / hbm,
              1e-12 * none.split.optimizer);
  Config delayed = c;
  delayed.optim.delayed_update = true;
  EXPECT_NEAR(predict(delayed, 1, 1, m).split.optimizer, none.split.optimizer + 8 * n / hbm,
              1e-12 * none.split.optimizer);
  c.optim.offload = Offload::Host;
  const Prediction host = predict(c, 1, 1, m);
  EXPECT_EQ(host.offload, Offload::Host);
  EXPECT_NEAR(host.split.optimizer, 34 * n / m.host_mem_bw + 6 * n / m.pcie_bw, 1e-12 * host.split.optimizer);
  // The state's 12 bytes an element on the device (plan_rank's RankMemory::device_optimizer), the rest alike.
  EXPECT_DOUBLE_EQ(none.device_optimizer_bytes, 12 * n);
  EXPECT_DOUBLE_EQ(host.device_optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(none.device_bytes - host.device_bytes, 12 * n);
  // PCIe does not touch the step with the state on the device.
  Machine slow_pcie = m;
  slow_pcie.pcie_bw = 1e3;
  c.optim.offload = Offload::None;
  EXPECT_DOUBLE_EQ(predict(c, 1, 1, slow_pcie).step_s, none.step_s);
  // auto, as the trainer resolves it: none where the device holds the state, else host.
  c.optim.offload = Offload::Auto;
  EXPECT_EQ(predict(c, 1, 1, m).offload, Offload::None);
  EXPECT_DOUBLE_EQ(predict(c, 1, 1, m).step_s, none.step_s);
  m.mem_bytes = (host.device_bytes + none.device_bytes) / 2;
  EXPECT_EQ(predict(c, 1, 1, m).offload, Offload::Host);
  EXPECT_DOUBLE_EQ(predict(c, 1, 1, m).step_s, host.step_s);
  c.optim.zero = ZeroStage(3);
  EXPECT_EQ(predict(c, 1, 1, parse_machine(kMachine, "m.ini")).offload, Offload::None);
  EXPECT_EQ(predict(c, 1, 1, cpu_node(64)).offload, Offload::Host);
  // At ZeRO 3 the state on the device keeps the shard's reduced gradient there too: 16 bytes an element. Each of
  // the step's 2 micro-batches lands its reduced shard in it, the first written (copy_cost: 8 bytes an element),
  // the second added (add_cost: 12), on top of the AdamW and the norm's 34.
  c.optim.offload = Offload::None;
  const Prediction z3 = predict(c, 1, 1, parse_machine(kMachine, "m.ini"));
  EXPECT_DOUBLE_EQ(z3.device_optimizer_bytes, 16 * n);
  EXPECT_NEAR(z3.split.optimizer, (34 + 8 + 12) * n / hbm, 1e-12 * z3.split.optimizer);
}

TEST(PlannerPredict, GemmTilesRunInWavesOverTheSms) {
  // 16384 x 1600 (GPT-2 1.5B's projection on 16 x 1024 tokens) on 132 SMs: 128 x 128 tiles fill best, 128 x 13 =
  // 1664 tiles in 13 waves of 132 (1716 slots), the last tile column 1600 - 12 x 128 = 64 wide: 1600 / 1716.
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(132, 16384, 1600), 1600.0 / 1716);
  // Whole waves of whole tiles: nothing lost (256 x 128 tiles, 132 of them).
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(132, 132 * 256, 128), 1);
  // Fewer tiles than SMs: K is split over the idle SMs, only the edge tiles' padding counts (1000 of 1024).
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(132, 1000, 1000), 1e6 / (1024.0 * 1024));
  EXPECT_DOUBLE_EQ(gemm_wave_efficiency(0, 1000, 1000), 1);  // a cpu: no waves
  // In the step: the tiny deck's GEMMs (1024 tokens, 128 to 4000 features) are whole 128-row tiles in whole waves
  // on one SM, or all in one partial wave with K split on many: the same padding either way. On 7 SMs qkv's 24
  // tiles take 4 waves (28 slots), and the step is slower.
  Config c = tiny_deck();
  c.train.device = "cuda";
  Machine m = parse_machine(kMachine, "m.ini");
  const auto compute = [&](int sms) {
    m.sm_count = sms;
    return predict(c, 1, 1, m).split.compute;
  };
  EXPECT_DOUBLE_EQ(compute(1), compute(1 << 20));
  EXPECT_GT(compute(7), compute(1));
}

TEST(PlannerPredict, TensorCoresRunAtTheSustainedClock) {
  // GEMMs and attention run at sustained_clock x the peak's clock: with memory-bound ops and launches aside, half
  // the clock doubles the compute.
  Config c = tiny_deck();
  c.train.device = "cuda";
  Machine m = parse_machine(kMachine, "m.ini");
  m.mem_bw = 1e30;
  m.launch_s = 0;
  const double full = predict(c, 1, 1, m).split.compute;
  m.sustained_clock /= 2;
  EXPECT_NEAR(predict(c, 1, 1, m).split.compute, 2 * full, 1e-9 * full);
}

TEST(PlannerPredict, EveryStepWaitsOnTheWorldsScalars) {
  // Beyond its passes a step waits for the loss and gradient-norm sums (two tree all-reduces of a double: 2 log2 8
  // alpha each on 8 ranks) and three gathers to rank 0 (log2 8 alpha each) over the world. With the links' bandwidth
  // unbounded, 4 ranks per node, [link.inter]'s latency alpha adds those 21 alpha and the 6 alpha of the gradient
  // all-reduce's last bucket (a tree over the 8 data-parallel ranks, after the backward).
  Config c = tiny_deck();
  c.train.device = "cuda";
  c.train.global_batch = 64;
  c.optim.zero = ZeroStage(0);
  Machine m = parse_machine(kMachine, "m.ini");
  m.intra.bandwidth = m.inter.bandwidth = 1e30;
  const double alpha = m.inter.latency_s;
  const Prediction waits = predict(c, 8, 4, m);
  m.inter.latency_s = 0;
  const Prediction none = predict(c, 8, 4, m);
  EXPECT_NEAR(waits.step_s - none.step_s, (21 + 6) * alpha, 1e-6 * alpha);
  EXPECT_NEAR(waits.split.comm - none.split.comm, (21 + 6) * alpha, 1e-6 * alpha);
}

// The published anchors the shipped machine files are held to (issue 26), and the one GPU this project has run on
// (OneH100AsMeasured). Each check is of the model's inputs (machine files, kernel counts, FLOP and byte counts): a
// change that moves a prediction past the band should be explained by a source or a measurement, not by tuning a
// number to the anchor. Each band is narrow enough that the same model 1.3x too fast or 1.3x too slow (the machine
// files' GEMM and attention efficiencies and bandwidths scaled by 1.3 either way, latencies and the launch gap
// inversely; peak_flops kept, MFU divides by it) falls outside it. The H100 file's memory-bound share is fitted to
// the H100 runs of 2026-11-27; no document gives the H100's clock under sustained load. The bands:
//   llm.c, GPT-2 1.5B (48 x 1600, 25 heads, seq 1024) on one H100 SXM, bf16, no recompute, 1M-token batches of
//     16-sequence micro-batches: about 50% MFU (karpathy/llm.c discussion #677), with faster kernels than this
//     project's: from 0.7x to 1.0x of that (predicted 43.7%, 0.87x, the optimizer on the GPU as llm.c keeps it, and
//     cuDNN's attention as llm.c's).
//   Megatron-LM on H100 at 41-48% MFU (NVIDIA's published GPT runs): Yuan-4.7B on one 8-GPU node from 47% (the
//     range's bottom x 1.15: data parallelism of a 4.7B model pays none of the tensor and pipeline parallelism
//     those larger runs pay) to 1.3x its top (predicted 55.4%, the optimizer on the GPUs; 53.3% on the host;
//     cuDNN's attention).
//   ASC22, Yuan-4.7B on 4 V100s, 1B tokens in 67.75 h (fp16, data parallel with ZeRO, recompute). This project's
//     kernels need sm80 (bf16 mma.sync, cuBLASLt bf16), so the V100 prediction is of its fused, flash-style step
//     ported to fp16; the ASC22 stack ran unfused attention (the [T,T] scores through HBM, about +20% step time by
//     itself): the model must come out faster, by 1.05x to 1.7x (predicted 51.2 h, 1.32x).
namespace {

std::string ratio_line(const char* what, double predicted, double anchor, const char* unit) {
  return strf("%s: predicted %.3g %s, anchor %.3g %s, ratio %.2f", what, predicted, unit, anchor, unit,
              predicted / anchor);
}

Config cuda_deck(GPTConfig model, int micro_batch, int global_batch) {
  Config c;
  c.model = model;
  c.train.micro_batch = micro_batch;
  c.train.global_batch = global_batch;
  c.train.device = "cuda";
  c.data.train = "data/none/train_*.h5";  // named, never read
  return c;
}

const GPTConfig kYuan47B = {40, 24, 3072, 2048, 53248};

}  // namespace

// This project's runs on one H100 80GB HBM3 of a 16-core VM, 2026-11-27 (docs/BENCHMARKS.md, GPU): the file's
// GPU figures (its mem_efficiency fitted to these runs' compute times) with that host's, whose AdamW ran at about
// 110 GB/s (1.31B parameters in 0.378 s, 4.7B in 1.207 s, 30 bytes each). The offload runs' steps hold the
// transfers and the delayed update's hiding to what was measured; the trainer's gpt-small step was measured 22-26%
// slower than the model says (about 80 ms a step it does not account for), which its band records.
TEST(PlannerAnchors, OneH100AsMeasured) {
  Machine h100 = read_machine("input/machines/h100-sxm.ini");
  h100.host_mem_bw = 110e9;
  h100.host_cores = 16;
  struct Run {
    const char* what;
    GPTConfig model;
    int micro_batch, global_batch;
    bool recompute, delayed;
    double measured_s, low, high;  // the band of predicted / measured
  };
  const GPTConfig xl = {24, 16, 2048, 1024, 50257};
  const Run runs[] = {
      {"bench_gpu_offload gpt-xl, B 16 x 8", xl, 16, 128, false, false, 2.959, 0.9, 1.1},
      {"the same, delayed update", xl, 16, 128, false, true, 2.699, 0.9, 1.1},
      {"bench_gpu_offload Yuan-4.7B, B 1 x 16, recompute, delayed", kYuan47B, 1, 16, true, true, 3.332, 0.9, 1.1},
      {"trainer gpt-small, micro-batch 64", {12, 12, 768, 1024, 50304}, 64, 64, false, false, 0.343, 0.7, 0.85},
  };
  for (const Run& r : runs) {
    Config c = cuda_deck(r.model, r.micro_batch, r.global_batch);
    c.optim.zero = ZeroStage(0);
    c.optim.offload = Offload::Host;  // as they ran
    c.train.recompute = r.recompute;
    c.optim.delayed_update = r.delayed;
    c.model.attention = AttentionKernels::Own;  // as they ran, before cuDNN's attention
    const Prediction p = predict(c, 1, 1, h100);
    ASSERT_TRUE(p.fits) << r.what << ": " << p.short_of;
    std::printf("%s\n", ratio_line(r.what, p.step_s, r.measured_s, "s").c_str());
    EXPECT_GT(p.step_s / r.measured_s, r.low) << r.what;
    EXPECT_LT(p.step_s / r.measured_s, r.high) << r.what;
  }
}

// llm.c's kernels (cuBLAS, cuDNN's flash attention) are faster than this project's (gpt-small measured at 0.63 of
// PyTorch's torch.compile on the same H100), so its ~50% is a ceiling for the model's answer, not a target.
TEST(PlannerAnchors, LlmcGpt2XlOnOneH100) {
  const Machine h100 = read_machine("input/machines/h100-sxm.ini");
  Config c = cuda_deck({48, 25, 1600, 1024, 50304}, 16, 1024);
  c.optim.zero = ZeroStage(0);
  const Prediction p = predict(c, 1, 1, h100);
  ASSERT_TRUE(p.fits) << p.short_of;
  std::printf("%s\n", ratio_line("GPT-2 1.5B, 1 H100, MFU (llm.c)", 100 * p.mfu, 50, "%").c_str());
  EXPECT_GT(p.mfu / 0.50, 0.7);
  EXPECT_LT(p.mfu / 0.50, 1.0);
}

// Megatron-LM keeps the optimizer on the GPUs, and so does the planner's first layout: Yuan-4.7B's fp32 master
// weights and moments, 12 bytes a parameter over 8 ranks at ZeRO 1 (6.6 GiB each), fit beside the rest of an H100's
// plan, and the GPU AdamW (about 20 ms a step) beats the host's with its PCIe transfers (about 300 ms).
TEST(PlannerAnchors, Yuan47BOnOneH100NodeAgainstMegatron) {
  const Machine h100 = read_machine("input/machines/h100-sxm.ini");
  const Search s = search_layouts(cuda_deck(kYuan47B, 1, 512), 1, 8, h100);
  ASSERT_FALSE(s.fitting.empty());
  const Prediction& p = s.fitting[0].prediction;
  std::printf("%s (%s; 1B tokens in %.3g h)\n",
              ratio_line("Yuan-4.7B, 8 H100, MFU (Megatron-LM 41-48%)", 100 * p.mfu, 48, "%").c_str(),
              s.fitting[0].layout.c_str(), 1e9 / p.tokens_per_s / 3600);
  EXPECT_EQ(s.fitting[0].config.optim.offload, Offload::None) << s.fitting[0].layout;
  EXPECT_GT(p.mfu, 0.41 * 1.15);
  EXPECT_LT(p.mfu, 0.48 * 1.3);
}

TEST(PlannerAnchors, Yuan47BOnFourV100AsAsc22) {
  const Machine v100 = read_machine("input/machines/v100.ini");
  Config c = cuda_deck(kYuan47B, 1, 512);
  c.train.recompute = true;
  c.optim.zero = ZeroStage(2);
  const Prediction p = predict(c, 4, 4, v100);
  ASSERT_TRUE(p.fits) << p.short_of;
  const double hours = 1e9 / p.tokens_per_s / 3600;
  std::printf("%s\n", ratio_line("Yuan-4.7B, 4 V100, hours to 1B tokens (ASC22)", hours, 67.75, "h").c_str());
  EXPECT_LT(hours, 67.75 / 1.05);
  EXPECT_GT(hours, 67.75 / 1.7);
}

namespace {

// one, two, two, two, one on 4 nodes of 2 ranks (ranks 0 | 1-2 | 3-4 | 5-6 | 7) of tiny_deck's model.
Config pipelined_deck() {
  Config c = tiny_deck();
  c.parallel.templates = {"one: wte, wpe, h.0-h.3, ln_f", "two: wte, wpe, h.0-h.1 | h.2-h.3, ln_f"};
  c.parallel.pipelines = "one,two,two,two,one";
  c.parallel.microbatches = "one:1,two:2";
  c.train.global_batch = 8;
  c.train.micro_batch = 1;
  return c;
}

}  // namespace

TEST(PlannerReplan, PicksThePredictedFastestOfTheRuleLayouts) {
  // Node 1 lost: pipelines 1 and 2 are rebuilt from "one" or dropped, and the micro-batches shared every way. On
  // the cpu node the ranks share the node's rate, so layouts that leave ranks idle can be faster than the FLOPs
  // rule's, which only counts a stage's FLOPs: the pick is the fastest by the model, the rule's only where it is.
  const Config c = pipelined_deck();
  const Machine m = cpu_node(64);
  const std::vector<layout::Replan> all = layout::replan_candidates(c, 3, 2, {1});
  ASSERT_GT(all.size(), 2u);
  double fastest = 1e300;
  for (const layout::Replan& r : all) fastest = std::min(fastest, predict(r.config, r.world, 2, m).step_s);
  const ReplanChoice choice = best_replan(c, 3, 2, {1}, m, "m.ini");
  EXPECT_EQ(choice.considered, static_cast<int>(all.size()));
  EXPECT_DOUBLE_EQ(choice.prediction.step_s, fastest);
  EXPECT_DOUBLE_EQ(choice.rule.step_s, predict(all.front().config, all.front().world, 2, m).step_s);
  EXPECT_DOUBLE_EQ(predict(choice.replan.config, choice.replan.world, 2, m).step_s, choice.prediction.step_s);
  // Here the model finds a clearly faster layout than the rule's (checked: more than 10% faster)...
  EXPECT_LT(choice.prediction.step_s, 0.9 * choice.rule.step_s);
  EXPECT_NE(choice.replan.overrides, all.front().overrides);
  EXPECT_NE(choice.replan.notes.back().find("the FLOPs rule's own would take"), std::string::npos);
  // ...while a job with one layout to choose (data parallelism) keeps the rule's, and says so.
  Config dp = tiny_deck();
  dp.train.micro_batch = 2;
  const ReplanChoice same = best_replan(dp, 1, 2, {1}, m, "m.ini");
  EXPECT_EQ(same.considered, 1);
  EXPECT_EQ(same.replan.overrides, layout::replan(dp, 1, 2, {1}).overrides);
  EXPECT_NE(same.replan.notes.back().find("the FLOPs rule's own"), std::string::npos);
  EXPECT_DOUBLE_EQ(same.prediction.step_s, same.rule.step_s);
}

TEST(PlannerReplan, TheLinkDecidesBetweenTheRulesLayoutAndTheOneLeftIdle) {
  // two (ranks 0-1), one (rank 2) on 3 nodes of a rank; node 0 lost: pipeline 0 is rebuilt from "one" on rank 1
  // (the FLOPs rule: two replicas, their gradients reduced across nodes) or dropped (one replica, no reduction).
  // Over the test cluster's slow link the lone replica is predicted faster and is chosen; over a fast one the rule's
  // two replicas are, and the rule's layout stays.
  Config c = tiny_deck();
  c.parallel.templates = {"one: wte, wpe, h.0-h.3, ln_f", "two: wte, wpe, h.0-h.1 | h.2-h.3, ln_f"};
  c.parallel.pipelines = "two,one";
  c.parallel.microbatches = "two:4,one:4";
  c.train.global_batch = 16;
  c.train.micro_batch = 2;
  const std::vector<layout::Replan> all = layout::replan_candidates(c, 2, 1, {0});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].config.parallel.pipelines, "one,one");
  EXPECT_EQ(all[1].config.parallel.pipelines, "one");
  for (double inter_bw : {264e6, 1e12}) {
    SCOPED_TRACE(inter_bw);
    Machine m = cpu_node(64);
    m.inter.bandwidth = inter_bw;
    const double rule = predict(all[0].config, all[0].world, 1, m).step_s;
    const double alone = predict(all[1].config, all[1].world, 1, m).step_s;
    const ReplanChoice choice = best_replan(c, 2, 1, {0}, m, "m.ini");
    EXPECT_EQ(choice.replan.overrides, all[alone < rule ? 1 : 0].overrides);
    EXPECT_DOUBLE_EQ(choice.prediction.step_s, std::min(rule, alone));
    // The two machines are picked to fall either side, by a clear margin.
    if (inter_bw < 1e9) EXPECT_LT(alone, 0.9 * rule);
    else EXPECT_LT(rule, 0.9 * alone);
  }
}

TEST(PlannerReplan, AMachineTooSmallRefusesWithWhatIsShort) {
  std::string why;
  try {
    best_replan(pipelined_deck(), 3, 2, {1}, cpu_node(0.001), "small.ini");
  } catch (const Error& e) {
    why = e.what();
  }
  EXPECT_EQ(why.rfind("replan: no layout of the 3 surviving nodes x 2 ranks fits test node (small.ini): of ", 0), 0u)
      << why;
  EXPECT_NE(why.find("is short of host memory: node"), std::string::npos) << why;
}
