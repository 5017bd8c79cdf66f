// `yuanlm plan --calibrate`: every number of the machine file measured here, each with how, when and where. The
// compute and memory figures come from the CPU backend's own ops (the matmul and the memory-bound ops the program
// runs) and the host AdamW the optimizer runs, timed on every rank at once with the threads each rank trains with,
// so that a node's figure is what its ranks get together when they share it; the links come from the ping-pong
// that tools/bench/bench_pingpong.cpp also runs.
#include "planner/calibrate.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <omp.h>

#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/ping_pong.h"
#include "comm/world.h"
#include "ops/adamw.h"
#include "ops/reference_ops.h"
#include "planner/machine.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"

namespace yuan::planner {

namespace {

constexpr double kRepSeconds = 0.015;  // one timed repetition of an op
constexpr int kReps = 7;               // repetitions; the median is the figure
constexpr double kLinkSeconds = 0.5;  // each ping-pong size
constexpr size_t kSmall = 8, kLarge = 4 << 20;

// Each part of the measurement is said as it starts, on rank 0. Test hook (tests/mpi/test_calibrate.sh):
// YUANLM_CALIBRATE_STOP=RANK:PART stops that rank (SIGSTOP) as PART starts, as a rank whose node stopped answering.
void begin(const char* part) {
  static const std::string stop = std::getenv("YUANLM_CALIBRATE_STOP") ? std::getenv("YUANLM_CALIBRATE_STOP") : "";
  say("calibrate: %s", part);
  if (stop == strf("%d:%s", comm::world().rank, part)) std::raise(SIGSTOP);
}

// Seconds per call of `f`: the median of kReps repetitions of as many calls as fill about kRepSeconds, after a
// first call that faults the buffers in and loads the library's kernels. The median, as the trainer's step time is
// read (metrics step_s): what the node gives its ranks with whatever else shares its cores (the ranks of the node
// run theirs at the same time: that sharing is measured too); the fastest would be what an idle node gives.
// A rank that has its repetitions goes on calling `f`, untimed, until every rank has: the ranks that share a
// node's cores (or a vCPU's sibling, or its memory) must share them for the whole of every rank's measurement, as
// they do for a whole step, or the last to finish runs its last repetitions on a freed core and the node's sum of
// rates comes out high (4 ranks on the 2-core VM read 1.20 x the GEMM rate of 2 ranks without this, 1.05 x with it;
// docs/BENCHMARKS.md, 2026-11-27).
template <typename F>
double seconds_per_call(F&& f) {
  f();
  double t0 = now_seconds();
  f();
  const double once = std::max(now_seconds() - t0, 1e-7);
  const int calls = std::max(1, static_cast<int>(kRepSeconds / once));
  std::vector<double> reps;
  for (int r = 0; r < kReps; r++) {
    t0 = now_seconds();
    for (int i = 0; i < calls; i++) f();
    reps.push_back((now_seconds() - t0) / calls);
  }
  comm::barrier_doing("calibration company", f);
  std::nth_element(reps.begin(), reps.begin() + kReps / 2, reps.end());
  return reps[kReps / 2];
}

// A GEMM of the program's kind: [N, C] activations times [OC, C] weights, with a bias.
struct Shape {
  int N, C, OC;
  double flops() const { return 6.0 * N * C * OC; }  // forward 2 N C OC, backward twice that (dinp and dw)
};
// From a few MFLOPs (a small model's projections, where call overheads and cache tiles dominate) to GFLOPs (where
// the rate levels off); the largest takes about a tenth of a second on one core.
const Shape kShapes[] = {{32, 32, 128}, {128, 64, 256}, {256, 128, 512}, {512, 256, 1024}, {1024, 512, 2048}};
constexpr int kNumShapes = sizeof kShapes / sizeof kShapes[0];

// Memory-bound ops on [kRows, kWidth] activations: 48 MiB a tensor, past the last-level caches, as a real model's
// activations are.
constexpr int kRows = 16384, kWidth = 768;
constexpr size_t kAdamW = size_t{4} << 20;  // parameters of the host AdamW: 16 MiB an array
constexpr double kAdamWBytes = 28;          // per parameter: reads w, g, m, v and writes w, m, v, fp32

// The matmul op's forward and backward at each shape: seconds per pair, on this rank.
std::vector<double> time_gemms(Backend& be) {
  Ops& ops = be.ops();
  std::vector<double> secs;
  for (const Shape& s : kShapes) {
    auto tensor = [&](int64_t rows, int64_t cols) {
      Allocation a = be.alloc(static_cast<size_t>(rows * cols) * sizeof(float), Mem::Activations);
      std::fill_n(a.as<float>(), rows * cols, 0.01f);
      return a;
    };
    Allocation in = tensor(s.N, s.C), w = tensor(s.OC, s.C), bias = tensor(1, s.OC), out = tensor(s.N, s.OC),
               din = tensor(s.N, s.C), dw = tensor(s.OC, s.C), dbias = tensor(1, s.OC);
    const Tensor tin(in.as<float>(), DType::F32, s.N, s.C), tw(w.as<float>(), DType::F32, s.OC, s.C),
        tb(bias.as<float>(), DType::F32, 1, s.OC), tout(out.as<float>(), DType::F32, s.N, s.OC),
        tdin(din.as<float>(), DType::F32, s.N, s.C), tdw(dw.as<float>(), DType::F32, s.OC, s.C),
        tdb(dbias.as<float>(), DType::F32, 1, s.OC);
    comm::barrier();  // the ranks of a node run each shape together
    secs.push_back(seconds_per_call([&] {
      ops.matmul_forward(tout, tin, tw, tb, Tensor(), Tensor());
      ops.matmul_backward(tdin, tdw, tdb, tout, tin, tw, Tensor());
    }));
  }
  return secs;
}

// Bytes per second of the memory-bound ops LayerNorm forward and the bias-and-residual add, together (total bytes
// over total time), on this rank.
double time_memory_ops(Backend& be) {
  Ops& ops = be.ops();
  const size_t n = static_cast<size_t>(kRows) * kWidth;
  Allocation a = be.alloc(n * sizeof(float), Mem::Activations), b = be.alloc(n * sizeof(float), Mem::Activations),
             w = be.alloc(kWidth * sizeof(float), Mem::Activations),
             bias = be.alloc(kWidth * sizeof(float), Mem::Activations),
             stats = be.alloc(2 * kRows * sizeof(float), Mem::Activations);
  std::fill_n(a.as<float>(), n, 0.5f);
  std::fill_n(w.as<float>(), kWidth, 1.0f);
  const Tensor ta(a.as<float>(), DType::F32, kRows, kWidth), tb(b.as<float>(), DType::F32, kRows, kWidth),
      tw(w.as<float>(), DType::F32, 1, kWidth), tbias(bias.as<float>(), DType::F32, 1, kWidth),
      mean(stats.as<float>(), DType::F32, 1, kRows), rstd(stats.as<float>() + kRows, DType::F32, 1, kRows);
  comm::barrier();
  const double ln = seconds_per_call([&] { ops.layernorm_forward(tb, mean, rstd, ta, tw, tbias); });
  const double ln_bytes = 2.0 * n * sizeof(float) + 2.0 * kRows * sizeof(float);  // in, out, mean and rstd
  comm::barrier();
  const double add = seconds_per_call([&] { ops.bias_residual(tb, tbias, ta); });
  const double add_bytes = 3.0 * n * sizeof(float);  // out read and written, the residual read
  return (ln_bytes + add_bytes) / (ln + add);
}

// Bytes per second of the optimizer's fused host AdamW (kAdamWBytes a parameter), on this rank.
double time_adamw() {
  std::vector<float> p(kAdamW, 0.1f), m(kAdamW, 0.0f), v(kAdamW, 0.0f), g(kAdamW, 1e-3f);
  ops::AdamWHyper h;
  h.lr = 1e-4;
  h.weight_decay = 0.1;
  comm::barrier();
  const double s =
      seconds_per_call([&] { ops::adamw_update(p.data(), m.data(), v.data(), g.data(), nullptr, kAdamW, h); });
  return kAdamWBytes * kAdamW / s;
}

// The cpu backend's loops that are neither GEMMs nor memory-bound, at one rank's shape of a small model (a
// micro-batch of kLoopB sequences of kLoopT tokens, width kLoopC in kLoopHeads heads, vocabulary kLoopV): what a
// CPU step spends beside its GEMMs, and far below the GEMM rate or the memory's bandwidth.
constexpr int kLoopB = 4, kLoopT = 128, kLoopC = 128, kLoopHeads = 4, kLoopV = 4096;
struct LoopRates {
  double attention = 0;  // FLOP/s of attention forward and backward (the step model's causal FLOPs)
  double gelu = 0;       // elements/s of a GELU pass, forward and backward alike
  double softmax = 0;    // logits/s of the classifier's softmax and cross-entropy (with its gradient)
};
LoopRates time_cpu_loops() {
  const size_t N = static_cast<size_t>(kLoopB) * kLoopT, att = N * kLoopHeads * kLoopT, act = N * 4 * kLoopC;
  std::vector<float> qkv(N * 3 * kLoopC, 0.01f), dqkv(qkv.size()), out(N * kLoopC), dout(out.size(), 0.01f),
      probs(att), dprobs(att), pre(act, 0.5f), post(act), grad(act, 0.01f), logits(N * kLoopV, 0.01f), losses(N);
  std::vector<int32_t> targets(static_cast<size_t>(kLoopB) * (kLoopT + 1), 1);
  comm::barrier();
  const double forward = seconds_per_call([&] {
    ops::attention_forward(out.data(), probs.data(), qkv.data(), kLoopB, kLoopT, kLoopC, kLoopHeads);
  });
  comm::barrier();
  const double backward = seconds_per_call([&] {
    ops::attention_backward(dqkv.data(), dprobs.data(), dout.data(), qkv.data(), probs.data(), kLoopB, kLoopT,
                            kLoopC, kLoopHeads);
  });
  comm::barrier();
  const double gelu = seconds_per_call([&] {
    ops::gelu_forward(post.data(), pre.data(), act);
    ops::gelu_backward(grad.data(), pre.data(), post.data(), act);
  });
  comm::barrier();
  // The op overwrites the logits with their gradient (softmax - onehot), which keeps later calls' values in range.
  const double softmax = seconds_per_call([&] {
    ops::classifier_forward_backward(logits.data(), losses.data(), targets.data() + 1, kLoopB, kLoopT, kLoopV,
                                     kLoopT + 1, 1.0f);
  });
  const double causal = 2.0 * kLoopB * kLoopHeads * kLoopT * kLoopT * (kLoopC / kLoopHeads);  // as step_model counts
  return {3 * causal / (forward + backward), 2.0 * act / gelu, static_cast<double>(N) * kLoopV / softmax};
}

// t(F) = (F + half) / rate fitted to a node's seconds per GEMM `secs` of FLOPs `flops`, least squares on the
// relative error of t; `worst` is the largest relative error at the measured shapes.
struct GemmFit {
  double rate = 0, half = 0, worst = 0;
};
GemmFit fit_gemm(const std::vector<double>& flops, const std::vector<double>& secs) {
  // With u = 1/t and x = F/t the relative residual of a + b F is a u + b x - 1: linear in (a, b).
  double uu = 0, ux = 0, xx = 0, su = 0, sx = 0;
  for (size_t i = 0; i < flops.size(); i++) {
    const double u = 1 / secs[i], x = flops[i] / secs[i];
    uu += u * u, ux += u * x, xx += x * x, su += u, sx += x;
  }
  double a = (su * xx - sx * ux) / (uu * xx - ux * ux), b = (uu * sx - ux * su) / (uu * xx - ux * ux);
  if (a < 0) a = 0, b = sx / xx;  // no fall-off at these sizes: a constant rate
  GemmFit f{1 / b, a / b, 0};
  for (size_t i = 0; i < flops.size(); i++) f.worst = std::max(f.worst, std::fabs((a + b * flops[i]) / secs[i] - 1));
  return f;
}

// Ranks outside a ping-pong wait for it here without spinning on a core that it needs: ranks may outnumber a
// node's cores, and the test cluster's nodes share one machine's.
void quiet_barrier() {
  comm::barrier_doing("link measurement", [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); });
}

// The link between world ranks a and b, on every rank (they wait quietly meanwhile).
comm::PingPong measure_link(int a, int b) {
  const comm::PingPong p = comm::ping_pong(a, b, kSmall, kLarge, kLinkSeconds);
  quiet_barrier();
  const std::vector<double> v = comm::broadcast({p.latency_s, p.bandwidth}, a, "link figures");
  return {v[0], v[1]};
}

// Why `out` cannot be written (empty when it can): write_file_atomic writes OUT.tmp and renames it over OUT, so
// that is what is tried, and OUT must not be a directory.
std::string unwritable(const std::string& out) {
  if (out.empty()) return "plan --calibrate needs --out FILE, the machine file to write";
  const std::string tmp = out + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return strf("plan --calibrate: cannot write --out %s: %s (%s)", out.c_str(), tmp.c_str(), std::strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
  const int dir = ::open(out.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::close(dir);
    return strf("plan --calibrate: cannot write --out %s: it is a directory; give a file name", out.c_str());
  }
  return "";
}

// One host's figures from every rank's (`all`, `per` values a rank: seconds per GEMM at each shape, memory-bound
// bytes/s, AdamW bytes/s, the loops' rates (LoopRates), then the host's cores and available memory): its ranks ran
// at once, so the host's rates are their sums. A host is one node, or the nodes that run on one machine.
struct NodeFigures {
  int host = 0;   // its index among the hosts
  int node = 0;   // the host's first node
  int nodes = 1;  // its nodes
  int ranks = 0;  // its ranks, all nodes together
  std::vector<double> gemm_rate;  // FLOP/s at each shape
  GemmFit gemm;
  double mem_bw = 0, adamw_bw = 0, mem_bytes = 0;
  LoopRates loops;
  int cores = 0;
};
NodeFigures node_figures(int node, int nodes, const std::vector<int>& ranks, const std::vector<double>& all, int per,
                         const std::vector<double>& flops) {
  NodeFigures f;
  f.node = node;
  f.nodes = nodes;
  f.ranks = static_cast<int>(ranks.size());
  f.gemm_rate.assign(kNumShapes, 0.0);
  for (int r : ranks) {
    const double* v = &all[static_cast<size_t>(r) * per];
    for (int i = 0; i < kNumShapes; i++) f.gemm_rate[i] += flops[i] / v[i];
    f.mem_bw += v[kNumShapes];
    f.adamw_bw += v[kNumShapes + 1];
    f.loops.attention += v[kNumShapes + 2];
    f.loops.gelu += v[kNumShapes + 3];
    f.loops.softmax += v[kNumShapes + 4];
  }
  std::vector<double> secs;
  for (int i = 0; i < kNumShapes; i++) secs.push_back(flops[i] / f.gemm_rate[i]);
  f.gemm = fit_gemm(flops, secs);
  const double* first = &all[static_cast<size_t>(ranks[0]) * per];
  f.cores = static_cast<int>(first[kNumShapes + 5]);
  f.mem_bytes = first[kNumShapes + 6];
  return f;
}

// The machine's figures from two hosts': the slower GEMMs (and that host's shapes), the lesser of the rest. A step
// waits for its slowest host.
NodeFigures slowest(const NodeFigures& a, const NodeFigures& b) {
  NodeFigures f = a.gemm.rate <= b.gemm.rate ? a : b;
  f.mem_bw = std::min(a.mem_bw, b.mem_bw);
  f.adamw_bw = std::min(a.adamw_bw, b.adamw_bw);
  f.loops = {std::min(a.loops.attention, b.loops.attention), std::min(a.loops.gelu, b.loops.gelu),
             std::min(a.loops.softmax, b.loops.softmax)};
  f.mem_bytes = std::min(a.mem_bytes, b.mem_bytes);
  f.cores = std::min(a.cores, b.cores);
  return f;
}

// This kernel's boot id: one on every node that runs on one host (network and UTS namespaces, containers share
// the kernel), another on every other host. The node's name stands in where the kernel does not give it.
std::string boot_id(const std::string& node_name) {
  try {
    const std::string text = read_text("/proc/sys/kernel/random/boot_id");
    const std::string id = text.substr(0, text.find_first_of(" \n"));
    if (!id.empty()) return id;
  } catch (const Error&) {
    // No boot id (not Linux, or /proc not mounted): each node is taken for a host of its own.
  }
  return "node " + node_name;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char s[32];
  std::strftime(s, sizeof s, "%Y-%m-%d %H:%M UTC", &tm);
  return s;
}

// A measured link's two keys in `m` and `src`: ranks a and b, and where they are.
void describe_link(LinkClass& link, MachineSources& src, const std::string& section, const comm::PingPong& p,
                   std::pair<int, int> pair, const layout::NodeMap& nodes, const std::string& date) {
  if (pair.first < 0) return;
  const int na = nodes.node[pair.first], nb = nodes.node[pair.second];
  const std::string between =
      na == nb ? strf("ranks %d and %d on %s", pair.first, pair.second, nodes.names[na].c_str())
               : strf("rank %d on %s and rank %d on %s", pair.first, nodes.names[na].c_str(), pair.second,
                      nodes.names[nb].c_str());
  link = {p.latency_s, p.bandwidth};
  src[section + ".latency_s"] = strf("measured: MPI ping-pong, half the round trip of %zu B, %s, %s", kSmall,
                                     between.c_str(), date.c_str());
  src[section + ".bandwidth"] = strf("measured: MPI ping-pong, %zu MiB each way, %s, %s", kLarge >> 20,
                                     between.c_str(), date.c_str());
}

// The file's opening comment: what was measured where, and what peak_flops means on a CPU.
std::string header(const layout::NodeMap& nodes, int nodes_per_host, const std::string& date) {
  std::string names;
  for (int n = 0; n < nodes.nodes(); n++) names += (n ? ", " : "") + nodes.names[n];
  return strf("# Written by `yuanlm plan --calibrate` on %s, %s: %d rank%s on %d node%s.\n"
              "# Every rank ran each measurement at the same time, with the threads it trains with, so a node's\n"
              "# figure is what its ranks get together when they share it; the machine's are its slowest node's.\n"
              "# peak_flops on a CPU: the rate large GEMMs of the cpu backend's matmul op (OpenBLAS, fp32) reach that\n"
              "# way, not a datasheet figure: it is the peak the step model scales, so gemm_efficiency is 1.\n%s",
              names.c_str(), date.c_str(), comm::world().size, comm::world().size == 1 ? "" : "s",
              nodes.nodes(), nodes.nodes() == 1 ? "" : "s",
              nodes_per_host == 1 ? ""
                                  : strf("# The nodes run %d on one host (nodes_per_host): the [device] and [host] "
                                         "figures are a host's,\n# its nodes' ranks together.\n", nodes_per_host)
                                        .c_str());
}

}  // namespace

void calibrate(const std::string& out) {
  const comm::WorldInfo& w = comm::world();
  const std::string problem = comm::first_problem(w.rank == 0 ? unwritable(out) : "");
  if (!problem.empty()) throw Error(problem, true);
  const layout::NodeMap& nodes = comm::node_map();
  say("calibrating: %d rank%s on %d node%s, every rank measuring at once; then the links by ping-pong", w.size,
      w.size == 1 ? "" : "s", nodes.nodes(), nodes.nodes() == 1 ? "" : "s");

  auto backend = make_backend(Device::Cpu, BackendSpec{1, false, kWidth});
  begin("gemms");
  std::vector<double> mine = time_gemms(*backend);
  begin("memory-bound ops");
  mine.push_back(time_memory_ops(*backend));
  begin("adamw");
  mine.push_back(time_adamw());
  begin("loops");
  const LoopRates loops = time_cpu_loops();
  mine.insert(mine.end(), {loops.attention, loops.gelu, loops.softmax});
  backend.reset();
  // Each rank's figures, then its node's cores and memory (the node's lowest rank speaks for it).
  const NodeMemory mem = node_available_memory();
  mine.push_back(static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)));
  mine.push_back(static_cast<double>(mem.available));
  begin("figures");
  const int per = static_cast<int>(mine.size());
  const std::vector<double> all = comm::gather(mine, "calibration figures");
  const std::vector<std::string> ids = comm::gather_strings(boot_id(nodes.names[nodes.node[w.rank]]));

  // The links: two ranks of the first node that has two, and rank 0 with the first rank of node 1.
  comm::PingPong intra, inter;
  std::pair<int, int> intra_pair{-1, -1}, inter_pair{-1, -1};
  for (int n = 0; n < nodes.nodes() && intra_pair.first < 0; n++)
    if (nodes.ranks_on(n).size() >= 2) intra_pair = {nodes.ranks_on(n)[0], nodes.ranks_on(n)[1]};
  if (nodes.nodes() >= 2) inter_pair = {0, nodes.ranks_on(1)[0]};
  begin("links");
  if (intra_pair.first >= 0) intra = measure_link(intra_pair.first, intra_pair.second);
  if (inter_pair.first >= 0) inter = measure_link(inter_pair.first, inter_pair.second);
  if (w.rank != 0) return;

  // The hosts: nodes whose ranks read one boot id share a machine's cores (the test cluster's namespaces), so
  // their ranks measured together: the host's rate is the sum of all its ranks' (they ran at once), and the
  // machine's figures are the slowest host's.
  std::vector<std::string> host_ids;
  std::vector<std::vector<int>> host_nodes;
  for (int n = 0; n < nodes.nodes(); n++) {
    const std::string& node_id = ids[static_cast<size_t>(nodes.ranks_on(n)[0])];
    const size_t h = std::find(host_ids.begin(), host_ids.end(), node_id) - host_ids.begin();
    if (h == host_ids.size()) {
      host_ids.push_back(node_id);
      host_nodes.emplace_back();
    }
    host_nodes[h].push_back(n);
  }
  std::vector<double> flops;
  for (const Shape& s : kShapes) flops.push_back(s.flops());
  NodeFigures slow;
  for (size_t h = 0; h < host_nodes.size(); h++) {
    std::vector<int> ranks;
    for (int n : host_nodes[h])
      for (int r : nodes.ranks_on(n)) ranks.push_back(r);
    NodeFigures f = node_figures(host_nodes[h][0], static_cast<int>(host_nodes[h].size()), ranks, all, per, flops);
    f.host = static_cast<int>(h);
    slow = h == 0 ? f : slowest(slow, f);
  }
  const std::string date = utc_now();
  const std::string when = strf("%s, host %s", date.c_str(), nodes.names[slow.node].c_str());
  const std::string on = strf("%d rank%s x %d thread%s of the %s at once", slow.ranks, slow.ranks == 1 ? "" : "s",
                              omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s",
                              slow.nodes == 1 ? "node" : strf("host (its %d nodes)", slow.nodes).c_str());
  std::string sizes, rates;
  for (int i = 0; i < kNumShapes; i++) {
    sizes += strf("%s%.3g", i ? "/" : "", flops[i] / 1e6);
    rates += strf("%s%.3g", i ? "/" : "", slow.gemm_rate[i] / 1e9);
  }
  Machine m;
  MachineSources src;
  m.name = strf("%s, calibrated", nodes.names[0].c_str());
  m.devices_per_node = static_cast<int>(nodes.ranks_on(0).size());
  src["machine.devices_per_node"] = strf("measured: ranks per node of the calibrating launch, %s", when.c_str());
  m.nodes_per_host = slow.nodes;
  std::string names;
  for (int n : host_nodes[slow.host]) names += (names.empty() ? "" : ", ") + nodes.names[n];
  src["machine.nodes_per_host"] = strf("measured: nodes whose ranks read one kernel boot id "
                                       "(/proc/sys/kernel/random/boot_id): %s, sharing one host's cores, %s",
                                       names.c_str(), date.c_str());
  m.kind = "cpu";
  m.peak_flops = slow.gemm.rate;
  src["device.peak_flops"] = strf("measured: the large-GEMM rate of the cpu backend's matmul op (forward + backward, "
                                  "fp32) fitted at %d shapes, %s (their sum), %s", kNumShapes, on.c_str(),
                                  when.c_str());
  m.gemm_efficiency = 1;
  src["device.gemm_efficiency"] = strf("measured: peak_flops is the measured large-GEMM rate itself, %s",
                                       when.c_str());
  // No fall-off down to the smallest shape fits as 0, which the format does not take (a rate that never falls):
  // one FLOP says the same.
  m.gemm_half_flops = std::max(slow.gemm.half, 1.0);
  src["device.gemm_half_flops"] = strf("measured: t = (FLOPs + half) / peak_flops fitted to the matmul op at %s "
                                       "MFLOP: %s GFLOP/s (worst error of the fit %.0f%%), %s", sizes.c_str(),
                                       rates.c_str(),
                                       100 * slow.gemm.worst, when.c_str());
  m.mem_bw = slow.mem_bw;
  src["device.mem_bw"] = strf("measured: the cpu backend's LayerNorm forward and bias-residual ops on [%d, %d] fp32 "
                              "(past the caches), bytes moved / time, %s, %s", kRows, kWidth, on.c_str(), when.c_str());
  const std::string shape = strf("B %d, T %d, C %d, %d heads", kLoopB, kLoopT, kLoopC, kLoopHeads);
  m.attention_flops = slow.loops.attention;
  src["device.attention_flops"] = strf("measured: the cpu attention op forward + backward at %s, its causal FLOPs "
                                       "(2 B heads T^2 hs, backward twice) / time, %s, %s", shape.c_str(), on.c_str(),
                                       when.c_str());
  m.gelu_rate = slow.loops.gelu;
  src["device.gelu_rate"] = strf("measured: the cpu GELU (tanh) forward + backward over %d x %d elements, elements "
                                 "per pass / time, %s, %s", kLoopB * kLoopT, 4 * kLoopC, on.c_str(), when.c_str());
  m.softmax_rate = slow.loops.softmax;
  src["device.softmax_rate"] = strf("measured: the cpu classifier op (softmax, cross-entropy and its gradient) over "
                                    "[%d, %d] logits, logits / time, %s, %s", kLoopB * kLoopT, kLoopV, on.c_str(),
                                    when.c_str());
  m.mem_bytes = 0;
  src["device.mem_bytes"] = "source: the cpu backend keeps everything in host memory ([host] mem_bytes)";
  m.pcie_bw = 0;
  src["device.pcie_bw"] = "source: the cpu backend has no host<->device transfer";
  m.host_mem_bytes = slow.mem_bytes;
  src["host.mem_bytes"] = strf("measured: what the node could give (%s) while calibrating, %s", mem.source.c_str(),
                               when.c_str());
  m.host_mem_bw = slow.adamw_bw;
  src["host.mem_bw"] = strf("measured: the optimizer's fused host AdamW over %zu Mi fp32 parameters, %.0f B each "
                            "(reads w, g, m, v; writes w, m, v), %s, %s", kAdamW >> 20, kAdamWBytes, on.c_str(),
                            when.c_str());
  m.host_cores = slow.cores;
  src["host.cores"] = strf("measured: online processors (sysconf)%s, %s", slow.nodes == 1 ? "" : " of the host",
                           when.c_str());
  describe_link(m.intra, src, "link.intra", intra, intra_pair, nodes, date);
  describe_link(m.inter, src, "link.inter", inter, inter_pair, nodes, date);
  if (intra_pair.first < 0) {
    // One rank per node: no two ranks share one. The copy into shared memory and out again that Open MPI makes of
    // a message between two ranks of a node runs at the memory's bandwidth; half of it stands in.
    m.intra = {0, m.mem_bw / 2};
    src["link.intra.latency_s"] = "source: not measured (no node had two ranks; run under mpirun -np 2 or more)";
    src["link.intra.bandwidth"] = "source: not measured (no node had two ranks): half of device.mem_bw, a message "
                                  "being copied into shared memory and out";
    warn("calibrate: no node had two ranks, so the link inside a node is not measured (half the memory bandwidth "
         "stands in); run under mpirun -np 2 or more");
  }
  if (inter_pair.first < 0) {
    m.inter = m.intra;
    src["link.inter.latency_s"] = src["link.inter.bandwidth"] =
        "source: not measured (one node): link.intra's figure stands in; calibrate under mpirun across two nodes";
    warn("calibrate: one node, so the link across nodes is not measured (the link inside one stands in); run under "
         "mpirun over two nodes or more");
  }
  for (double* x : {&m.peak_flops, &m.gemm_half_flops, &m.mem_bw, &m.attention_flops, &m.gelu_rate, &m.softmax_rate,
                    &m.host_mem_bw, &m.host_mem_bytes, &m.intra.latency_s, &m.intra.bandwidth, &m.inter.latency_s,
                    &m.inter.bandwidth})
    *x = std::stod(strf("%.3g", *x));  // the precision the measurements have
  write_file_atomic(out, header(nodes, m.nodes_per_host, date) + machine_text(m, src));
  say("calibrate: wrote %s: peak %.3g GFLOP/s (half rate at %.3g MFLOP), memory-bound ops %.3g GB/s, host AdamW "
      "%.3g GB/s, %d cores, %s; links %.2g us %.3g GB/s inside a node, %.2g us %.3g GB/s across", out.c_str(),
      m.peak_flops / 1e9, m.gemm_half_flops / 1e6, m.mem_bw / 1e9, m.host_mem_bw / 1e9, m.host_cores,
      format_bytes(m.host_mem_bytes).c_str(), m.intra.latency_s * 1e6, m.intra.bandwidth / 1e9,
      m.inter.latency_s * 1e6, m.inter.bandwidth / 1e9);
}

}  // namespace yuan::planner
