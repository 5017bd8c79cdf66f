#include "planner/step_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "backend/backend.h"
#include "layout/layout.h"
#include "layout/topology.h"
#include "model/gpt.h"
#include "ops/op_cost.h"
#include "optim/zero_spec.h"
#include "program/program.h"
#include "train/memory_plan.h"
#include "util/dtype.h"
#include "util/error.h"

namespace yuan::planner {

double collective_s(Collective op, double bytes, int ranks, const LinkClass& link) {
  const double a = link.latency_s, bw = link.bandwidth;
  if (op == Collective::SendRecv) return a + bytes / bw;
  if (ranks <= 1) return 0;
  const double D = ranks;
  const double ring_pass = (D - 1) * a + (D - 1) / D * bytes / bw;
  if (op != Collective::AllReduce) return ring_pass;
  // All-reduce: a reduce-scatter and an all-gather around the ring, or up and down a (pipelined, double binary)
  // tree, whose few steps win for small messages: the libraries pick the faster.
  const double tree = 2 * std::ceil(std::log2(D)) * a + 2 * bytes / bw;
  return std::min(2 * ring_pass, tree);
}

LinkClass group_link(const Machine& m, const std::vector<int>& ranks, int ranks_per_node) {
  std::map<int, int> on_node;  // members by node
  for (int r : ranks) on_node[r / ranks_per_node]++;
  if (on_node.size() <= 1) return m.intra;
  // A ring (or tree) over nodes crosses each node boundary once per channel, and the libraries spread their
  // channels over the node's network ports: the group's members on a node share their ports' bandwidth (the
  // other ranks of the node use theirs for their own groups at the same time). A cpu node's ranks share its one
  // port (Open MPI's TCP over the node's interface): the crossing runs at the link's bandwidth whatever the members.
  int members = m.cpu() ? 1 : ranks_per_node;
  for (const auto& [node, n] : on_node) members = std::min(members, n);
  return {m.inter.latency_s, std::min(m.intra.bandwidth, members * m.inter.bandwidth)};
}

// The output tiles cuBLAS's large-GEMM kernels compute per thread block (NVIDIA, "Matrix Multiplication Background
// User's Guide", DU-09799-001, sec. 2.3 "Typical Tile Dimensions in cuBLAS and Performance": 256x128 and 128x128
// are the most efficient); its heuristics pick one per shape.
constexpr double kGemmTiles[][2] = {{256, 128}, {128, 256}, {128, 128}};

double gemm_wave_efficiency(int sms, double m, double n) {
  if (sms <= 0) return 1;
  double best = 0;
  for (const auto& tile : kGemmTiles) {
    const double tiles = std::ceil(m / tile[0]) * std::ceil(n / tile[1]);
    const double slots = tiles >= sms ? std::ceil(tiles / sms) * sms : tiles;
    best = std::max(best, m * n / (slots * tile[0] * tile[1]));
  }
  return best;
}

Simulation simulate(layout::ScheduleKind kind, const std::vector<StageTimes>& stages, int micro_batches) {
  return simulate(kind, {SharedPipeline{stages, {}, micro_batches}}, {}).front();
}

std::vector<Simulation> simulate(layout::ScheduleKind kind, const std::vector<SharedPipeline>& pipelines,
                                 const std::vector<CorePool>& pools) {
  // One walker per stage of every pipeline: it waits for its next pass's input, computes (at its pools' share),
  // then talks (the pass's communication, at its own time), and moves on.
  enum Phase { Waiting, Computing, Talking };
  struct Walker {
    int pipeline, stage;
    std::vector<layout::PipeAction> actions;
    size_t next = 0;
    Phase phase = Waiting;
    double work = 0;   // Computing: seconds of compute left at the full rate
    double until = 0;  // Talking: when the pass ends
    double begin = 0;  // when the pass began
    double speed = 1;  // Computing: the share of the full rate it gets now
  };
  constexpr double kNotYet = -1;
  struct Done {
    std::vector<std::vector<double>> forward, backward;  // per stage, per micro-batch: when the pass ended
  };
  std::vector<Walker> walkers;
  std::vector<Done> done(pipelines.size());
  std::vector<Simulation> sims(pipelines.size());
  for (size_t p = 0; p < pipelines.size(); p++) {
    const int stages = static_cast<int>(pipelines[p].stages.size()), m = pipelines[p].micro_batches;
    for (int s = 0; s < stages; s++)
      walkers.push_back({static_cast<int>(p), s, layout::Schedule(kind, s, stages, m).actions()});
    done[p].forward.assign(stages, std::vector<double>(m, kNotYet));
    done[p].backward = done[p].forward;
    sims[p].busy.assign(stages, 0);
  }
  const auto pass_of = [&](const Walker& w) {
    const StageTimes& t = pipelines[w.pipeline].stages[w.stage];
    return w.actions[w.next].kind == layout::PipeAction::Forward ? t.forward : t.backward;
  };
  const auto finish = [&](Walker& w, double at) {
    const layout::PipeAction& a = w.actions[w.next];
    (a.kind == layout::PipeAction::Forward ? done[w.pipeline].forward : done[w.pipeline].backward)[w.stage][a.micro] =
        at;
    sims[w.pipeline].busy[w.stage] += at - w.begin;
    sims[w.pipeline].makespan = std::max(sims[w.pipeline].makespan, at);
    w.next++;
    w.phase = Waiting;
  };
  // When the input of the walker's next pass arrives: the activation from the stage before, or the gradient from
  // the stage after, plus the send; 0 for the first stage's forwards and the last's backwards; kNotYet when the
  // pass that makes it has not ended.
  const auto input_at = [&](const Walker& w) {
    const layout::PipeAction& a = w.actions[w.next];
    const std::vector<StageTimes>& st = pipelines[w.pipeline].stages;
    const Done& d = done[w.pipeline];
    const int s = w.stage;
    if (a.kind == layout::PipeAction::Forward) {
      if (s == 0) return 0.0;
      const double made = d.forward[s - 1][a.micro];
      return made == kNotYet ? kNotYet : made + st[s - 1].send_s;
    }
    if (s + 1 == static_cast<int>(st.size())) return 0.0;
    const double made = d.backward[s + 1][a.micro];
    return made == kNotYet ? kNotYet : made + st[s].send_s;
  };
  constexpr double kInf = 1e300;
  std::vector<double> computing(pools.size());
  for (double now = 0;;) {
    // Start every pass whose input is there; one of no length ends at once and may let another start.
    double arrival = kInf;
    for (bool started = true; started;) {
      started = false;
      arrival = kInf;
      for (Walker& w : walkers) {
        if (w.phase != Waiting || w.next == w.actions.size()) continue;
        const double at = input_at(w);
        if (at == kNotYet) continue;
        if (at > now) {
          arrival = std::min(arrival, at);
          continue;
        }
        const PassTimes pass = pass_of(w);
        w.begin = now;
        if (pass.compute > 0) {
          w.phase = Computing;
          w.work = pass.compute;
        } else if (pass.comm > 0) {
          w.phase = Talking;
          w.until = now + pass.comm;
        } else {
          finish(w, now);
          started = true;
        }
      }
    }
    // Each computing walker's share: the pool most wanted sets it.
    std::fill(computing.begin(), computing.end(), 0.0);
    for (const Walker& w : walkers)
      if (w.phase == Computing && !pipelines[w.pipeline].pools.empty())
        for (const auto& [pool, ranks] : pipelines[w.pipeline].pools[w.stage]) computing[pool] += ranks;
    double next = arrival;
    for (Walker& w : walkers) {
      if (w.phase == Talking) next = std::min(next, w.until);
      if (w.phase != Computing) continue;
      w.speed = 1;
      if (!pipelines[w.pipeline].pools.empty())
        for (const auto& [pool, ranks] : pipelines[w.pipeline].pools[w.stage])
          w.speed = std::min(w.speed, pools[pool].cores / (pools[pool].threads * computing[pool]));
      next = std::min(next, now + w.work / w.speed);
    }
    if (next == kInf) break;  // every walker at its end, or waiting for a pass that never comes
    // On to the next event: compute advances; what ends there (to rounding) ends.
    const double dt = next - now, close = 1e-12 * std::max(next, 1e-30);
    now = next;
    for (Walker& w : walkers) {
      if (w.phase == Computing) {
        w.work -= w.speed * dt;
        if (w.work <= close * w.speed) {
          const double comm = pass_of(w).comm;
          w.phase = comm > 0 ? Talking : Waiting;
          w.until = now + comm;
          if (comm == 0) finish(w, now);
        }
      } else if (w.phase == Talking && w.until <= now + close) {
        finish(w, now);
      }
    }
  }
  for (const Walker& w : walkers)
    YUAN_CHECK(w.next == w.actions.size(), "planner: the %s schedule of pipeline %d (%zu stages, %d micro-batches) "
               "deadlocks at stage %d", layout::schedule_name(kind), w.pipeline,
               pipelines[w.pipeline].stages.size(), pipelines[w.pipeline].micro_batches, w.stage);
  return sims;
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// One rank's share of its node's machine: what its ops run at.
struct Rates {
  double gemm = 0;       // FLOP/s large GEMMs reach
  double half = 0;       // gemm_half_flops
  double attention = 0;  // FLOP/s the flash attention kernels reach (cuda)
  double attention_backward = 0;  // the backward's GEMM-like products per the forward's, on the charged path
  double mem_bw = 0;     // bytes/s of memory-bound ops
  double launch = 0;     // seconds the device idles per kernel
  int sms = 0;           // streaming multiprocessors a GEMM's tiles run in waves over (0: no waves, cpu)
  // The cpu backend's own loops, measured by --calibrate (0: not measured, charged at the GEMM rate or bandwidth).
  double cpu_attention = 0;  // FLOP/s of the attention op
  double gelu = 0;           // elements/s of one GELU pass
  double softmax = 0;        // logits/s of the classifier op
  double host_bw = 0;  // bytes/s of the host AdamW
  double act = 4;      // bytes of an activation element
  double weight = 4;   // bytes of a working-weight element
  DType weights = DType::F32;
  bool cpu = true;
};

// A GEMM of `flops` reaches gemm x flops / (flops + half): its time is (flops + half) / gemm.
double gemm_s(const Rates& r, double flops, double count = 1) { return count * (flops + r.half) / r.gemm; }
double mem_s(const Rates& r, double bytes) { return bytes / r.mem_bw; }

// An m x n x k GEMM (2 m n k FLOPs): gemm_s with its waves' idle share added.
double gemm_mnk_s(const Rates& r, double m, double n, double k, double count = 1) {
  return count * (2 * m * n * k / gemm_wave_efficiency(r.sms, m, n) + r.half) / r.gemm;
}
// A linear layer of `in` -> `out` features over `tokens` rows: forward Y = X W; backward the input gradient
// dX = dY W^T (tokens x in over out) and the weight gradient dW = X^T dY (in x out over tokens).
double linear_forward_s(const Rates& r, double tokens, double in, double out) {
  return gemm_mnk_s(r, tokens, out, in);
}
double linear_backward_s(const Rates& r, double tokens, double in, double out) {
  return gemm_mnk_s(r, tokens, in, out) + gemm_mnk_s(r, in, out, tokens);
}

// Kernels the cuda backend launches per block (src/program/program.cpp's block passes, cuda/*.cu): forward
// layernorm, qkv, attention, projection (residual fused), layernorm, fc (GELU fused), fc projection; backward the
// four matmul_backwards (input-gradient GEMM, weight-gradient GEMM, the bias gradient's scratch add), attention's
// three (delta, kv, q) and two layernorm backwards.
constexpr double kBlockKernelsForward = 7, kBlockKernelsBackward = 4 * 3 + 3 + 2;

// The links the job's groups run on (group_link), for the job's placement. On a cpu host the ranks move their
// messages' bytes with their own cores (Open MPI's shared-memory copies, TCP's copies in the kernel): a link's
// calibrated bandwidth is what a pair gets with a core each (plan --calibrate's ping-pong, the other ranks idle), and
// where the host's ranks outnumber its cores and all move bytes at once, as in the step's reductions, each gets
// `cpu_share` of it (the test cluster's 4 ranks on the VM's 2 cores: half).
struct Links {
  const Machine& m;
  int per_node;
  double cpu_share = 1;  // cpu: min(1, the host's cores / its ranks)
  LinkClass of(const std::vector<int>& ranks) const {
    LinkClass link = group_link(m, ranks, per_node);
    link.bandwidth *= cpu_share;
    return link;
  }
};

// Forward and backward of one micro-batch of `range` on one tensor rank of `tp` (N = B T tokens).
StageTimes stage_times(const GPTConfig& g, const ModuleRange& range, int B, bool recompute, int tp,
                       const LinkClass& tensor_link, const Rates& r) {
  const double N = static_cast<double>(B) * g.seq_len, C = g.n_embd, S = g.seq_len, V = g.vocab_size;
  const double heads = static_cast<double>(g.n_head) / tp, hs = C / g.n_head, e = r.act;
  const auto tp_all_reduce = [&](double bytes) { return collective_s(Collective::AllReduce, bytes, tp, tensor_link); };
  StageTimes t;
  for (int mod = range.first; mod < range.end; mod++) {
    if (mod == kWteModule) {
      // Token and position lookups summed into the residual stream; backward scatters fp32 rows into wte.
      t.forward.compute += mem_s(r, 3 * N * C * e);
      t.backward.compute += mem_s(r, N * C * (e + 2 * 4));
      t.forward.comm += tp > 1 ? tp_all_reduce(N * C * e) : 0;  // the vocabulary-split lookup's partial sums
    } else if (mod == ln_f_module(g)) {
      // ln_f and the tied classifier over this rank's part of the vocabulary, its softmax and cross-entropy
      // (fp32 logits); tensor ranks share row maxima and sums, and sum the input gradient.
      // On cpu the classifier op is bound by its exp per logit (and its log), not by the bytes it streams.
      const double logits = N * V / tp;
      t.forward.compute += mem_s(r, 2 * N * C * e) + (r.softmax > 0 ? logits / r.softmax : mem_s(r, 3 * logits * 4)) +
                           linear_forward_s(r, N, C, V / tp);
      t.backward.compute += mem_s(r, 4 * N * C * e + 2 * N * V / tp * 4) + linear_backward_s(r, N, C, V / tp);
      t.forward.comm += tp > 1 ? 3 * tp_all_reduce(N * 4) : 0;
      t.backward.comm += tp > 1 ? tp_all_reduce(N * C * e) : 0;
    } else if (mod != kWpeModule) {
      // A block: qkv, projection, fc and fc projection (column- and row-parallel), attention, two layernorms,
      // two residual adds, GELU; backward runs each GEMM twice (input and weight gradients, of other shapes).
      // The layers' in -> out features on a tensor rank: qkv and fc column-split, projection and fc projection
      // row-split.
      const double layers[][2] = {{C, 3 * C / tp}, {C / tp, C}, {C, 4 * C / tp}, {4 * C / tp, C}};
      double gemms = 0, gemms_b = 0;
      for (const auto& l : layers) {
        gemms += linear_forward_s(r, N, l[0], l[1]);
        gemms_b += linear_backward_s(r, N, l[0], l[1]);
      }
      double attention_f = 0, attention_b = 0, softmax = 0;
      // GELU over the fc output: one pass each way; on cpu bound by its tanh when measured (gelu_rate), else by
      // the bytes it reads and writes.
      const double gelu_n = N * 4 * C / tp;
      double gelu_bytes = 2 * gelu_n * e, gelu_s = 0;
      if (r.cpu && r.gelu > 0) {
        gelu_bytes = 0;
        gelu_s = gelu_n / r.gelu;
      }
      if (r.cpu) {
        // src/ops/attention.cpp: causal loops per sequence and head, keeping the [T,T] probabilities: at the rate
        // the op itself reaches (attention_flops, its softmax and scalar loops included), else at the GEMM rate
        // plus the probabilities' bytes.
        const double per_head = 2 * S * S * hs;  // scores and values, causal half of 2 x 2 S^2 hs
        if (r.cpu_attention > 0) {
          attention_f = B * heads * per_head / r.cpu_attention;
          attention_b = 2 * attention_f;
        } else {
          attention_f = gemm_s(r, per_head, B * heads);
          attention_b = gemm_s(r, per_head, 2 * B * heads);
          softmax = B * heads * S * S * 4 * 2;
        }
      } else {
        // Flash-style, causal, at the rate the path's kernels reach (attention_charge; not the GEMM rate:
        // softmax, masking and the tiles' shapes keep them further from peak). Forward runs two GEMM-like
        // products (S = Q K^T, O = P V), backward attention_backward times as many.
        const double causal = 2 * N * S * C / tp;
        attention_f = causal / r.attention;
        attention_b = r.attention_backward * causal / r.attention;
      }
      const double memory_f = mem_s(r, 2 * 2 * N * C * e + 2 * 3 * N * C * e + gelu_bytes + softmax);
      const double launch_f = kBlockKernelsForward * r.launch, launch_b = kBlockKernelsBackward * r.launch;
      const PassTimes forward{gemms + attention_f + memory_f + gelu_s + launch_f,
                              tp > 1 ? 2 * tp_all_reduce(N * C * e) : 0};
      t.forward.compute += forward.compute;
      t.forward.comm += forward.comm;
      t.backward.compute += gemms_b + attention_b + 2 * memory_f + gelu_s + launch_b +
                            (recompute ? forward.compute : 0);
      t.backward.comm += forward.comm + (recompute ? forward.comm : 0);
    }
  }
  return t;
}

// The time after a stage's schedule: its data groups' collectives not hidden, and its optimizer.
struct After {
  double comm = 0, optimizer = 0;
};

After after_schedule(const Config& c, const layout::Topology& topo, int rank, const RankPlan& plan,
                     const StageTimes& times, int micro_batches, const Links& links, const Rates& r,
                     double pcie_bw, double schedule_s) {
  const layout::Place& place = topo.place(rank);
  const bool overlap = topo.replicas_only();
  // Collectives the cpu backend runs block the rank's only thread; cuda runs them on the NCCL stream.
  const bool hides = !r.cpu && overlap;
  const double backward_compute = times.backward.compute, m = micro_batches;
  double exposed = 0, shard = 0;
  double gathers = 0, gather_tail = 0;  // zero 1 and 2: the weights' all-gathers after the update, and the last's
  bool per_micro = false;  // the ZeroSpec's: zero 2 and 3 with overlap (zero 2 not with the state on the device)
  for (const ModuleRange& g : topo.module_groups_of(rank)) {
    const std::vector<int> holders = topo.holders(g.first, place.tp_rank);
    const int D = static_cast<int>(holders.size());
    const LinkClass link = links.of(holders);
    double params = 0, largest = 0, block = 0, blocks = 0;
    for (const ModuleSpec& s : plan.layout.modules())
      if (g.contains(s.index)) {
        params += static_cast<double>(s.numel);
        largest = std::max(largest, static_cast<double>(s.numel));
        if (s.index >= block_module(0) && s.index < ln_f_module(c.model)) {
          block = static_cast<double>(s.numel);
          blocks++;
        }
      }
    const int group_rank = static_cast<int>(std::find(holders.begin(), holders.end(), rank) - holders.begin());
    const ZeroSpec spec(plan.layout, g, c.optim, D, group_rank, overlap, r.weights);
    shard += static_cast<double>(spec.shard_n);
    per_micro = spec.per_micro;
    if (D == 1) continue;
    const double grads = 4 * params, weights = r.weight * params;
    const ZeroStage zero = c.optim.zero;
    // Reductions: one per step, or one per micro-batch as its backward finishes (zero 2 and 3 with overlap).
    const Collective reduction = zero.shards_optimizer_state() ? Collective::ReduceScatter : Collective::AllReduce;
    const double reduce = collective_s(reduction, grads, D, link);
    // What cannot hide: the last bucket, reduced after the backward that fills it ends.
    const double bucket = std::min(grads, (zero.shards_weights() ? largest * 4 : c.optim.bucket_mb * kMiB));
    const double tail = collective_s(reduction, bucket, D, link);
    const double reductions = per_micro ? m : 1;
    exposed += hides ? reductions * std::max(reduce - backward_compute, tail) : reductions * reduce;
    if (zero.shards_optimizer_state() && !zero.shards_weights()) {  // the updated shards all-gathered
      gathers += collective_s(Collective::AllGather, weights, D, link);
      gather_tail += collective_s(Collective::AllGather, std::min(weights, r.weight / 4 * bucket), D, link);
    }
    if (zero.shards_weights()) {
      // Each block is gathered for every pass, less the two still in the block buffers where one pass turns into
      // the next (tools/comm_volume.py); the embedding, wpe and ln_f once per step. On cuda the next module's
      // gather runs while this one computes: what shows is the gathers beyond the compute, and each pass's first.
      const double block_gathers = std::max(0.0, 2 * m * blocks - 2 * (2 * m - 1));
      const double per_block = collective_s(Collective::AllGather, r.weight * block, D, link);
      const double all = block_gathers * per_block +
                         collective_s(Collective::AllGather, r.weight * (params - blocks * block), D, link);
      const double compute = m * (times.forward.compute + times.backward.compute);
      exposed += hides ? std::max(all - compute, 0.0) + 2 * m * per_block : all;
    }
  }
  After a;
  a.comm = exposed + gathers;
  // The AdamW over the shard (every parameter the rank holds at zero 0) and, before it, the shard's squared gradient
  // norm (ZeroOptimizer::reduce_gradients; the clipping needs it first, so no delayed update hides it), at the bytes
  // op_cost.h counts: adamw_cost reads the fp32 gradient, master weight, m and v, writes the last three and the
  // working weight (bf16 on cuda: 4*4 + 3*4 + 2 = 30 bytes an element, 32 on the cpu backend), grad_norm_cost reads
  // the gradient once (4 bytes).
  const double update_bytes = ops::adamw_cost(shard, static_cast<int>(r.weight)).bytes;
  const double norm_bytes = ops::grad_norm_cost(shard).bytes;
  if (optimizer_on_device(c.optim)) {
    // optim.offload = none (optim/device_adamw.h): both on the GPU, from the reduced gradient where the backend
    // holds it, streaming at mem_efficiency x mem_bw as the other memory-bound kernels do (its launches, one per
    // weight-decay segment, are microseconds beside it); nothing crosses PCIe:
    //   optimizer = (adamw_cost(shard, 2).bytes + grad_norm_cost(shard).bytes) / (mem_efficiency x mem_bw)
    // With optim.delayed_update the reduced gradient is first copied aside (copy_cost(shard, 4, 4): 8 bytes an
    // element) and its update runs at the next step's end, on that step's path: nothing hides it. At zero 3 each
    // micro-batch's reduced shard lands in the device gradient shard on the compute stream, written by the first
    // (copy_cost: 8 bytes an element) and added by the others (add_cost: 12):
    //   + (copy_cost(shard, 4, 4).bytes + (m - 1) add_cost(shard).bytes) / (mem_efficiency x mem_bw)
    const double set_aside = c.optim.delayed_update ? ops::copy_cost(shard, 4, 4).bytes : 0;
    const double accumulate =
        c.optim.zero.shards_weights() ? ops::copy_cost(shard, 4, 4).bytes + (m - 1) * ops::add_cost(shard).bytes : 0;
    a.optimizer = mem_s(r, update_bytes + norm_bytes + set_aside + accumulate);
    return a;
  }
  // optim.offload = host: the AdamW on the host at its share of host_mem_bw; on cuda the transfers around it: the
  // gradients down, the weights up as bf16 for the gathers:
  //   optimizer = (adamw_cost(shard, 2).bytes + grad_norm_cost(shard).bytes) / host_bw + shard (4 + 2) / pcie_bw
  // (the AdamW's part behind the next step with the delayed update; at zero 2 and 3 the gradients' part per
  // micro-batch, below).
  const double adamw = update_bytes / r.host_bw;
  double transfers = r.cpu ? 0 : shard * r.weight / pcie_bw;
  // The gradients go down once after the step's reductions, or (zero 2 and 3 with overlap) every micro-batch
  // beside its backward, each later micro-batch's part then added into the host gradient on the rank's thread
  // (HostGradient::end_micro_batch: two reads and a write of the shard in fp32).
  const double download = r.cpu ? 0 : shard * 4 / pcie_bw;
  transfers += per_micro ? 0 : download;
  const double accumulate = per_micro ? m * std::max(download - backward_compute, 0.0) +
                                            (m - 1) * shard * 3 * 4 / r.host_bw
                                      : 0;
  // The delayed update runs step t's AdamW beside step t+1's passes; the transfers stay on the step's path (the
  // gradients are down before the thread starts, its weights up before the step after next: bench_gpu_offload on
  // an H100, 2026-11-27, measured them as exposed with the delayed update as without), and so does the
  // accumulation, part of the passes.
  a.optimizer = (c.optim.delayed_update ? std::max(0.0, adamw - schedule_s) : adamw) + transfers + accumulate +
                norm_bytes / r.host_bw;
  // On cuda each bucket's gather goes out on the NCCL stream as soon as its part is uploaded, beside the AdamW of
  // the buckets after it (optim/host_adamw.h): what shows is the gathers beyond the AdamW, and the last bucket's.
  // The delayed update lands its weights at once, gathers and all, on the step's path.
  if (!r.cpu && !c.optim.delayed_update) a.comm -= gathers - std::max(gathers - adamw, gather_tail);
  return a;
}

std::string gib(double b) { return strf("%.2f GiB", b / kGiB); }

}  // namespace

AttentionCharge attention_charge(const Config& c, const Machine& m, const std::string& file) {
  const Device device = m.cpu() ? Device::Cpu : Device::Cuda;
  const std::string where = file.empty() ? "machine '" + m.name + "'" : file;
  if (c.model.attention == AttentionKernels::Cudnn && m.cudnn_attention_efficiency == 0)
    throw Error(strf("model.attention = cudnn, but %s gives no [device] cudnn_attention_efficiency: cuDNN's fused "
                     "attention is not available on that machine (auto or own plan for this project's)",
                     where.c_str()), true);
  const AttentionChoice chosen = choose_attention(device, c.model);
  if (chosen.path == AttentionPath::Own)
    return {AttentionPath::Own, m.attention_efficiency, "own kernels at device.attention_efficiency: " + chosen.why};
  if (m.cudnn_attention_efficiency == 0)
    return {AttentionPath::Own, m.attention_efficiency,
            "own kernels at device.attention_efficiency: " + where + " gives no cudnn_attention_efficiency "
            "(cuDNN's fused attention does not run there)"};
  return {AttentionPath::Cudnn, m.cudnn_attention_efficiency,
          "cuDNN's fused attention at device.cudnn_attention_efficiency" +
              (chosen.why.empty() ? std::string() : " (" + chosen.why + ")")};
}

Prediction predict(const Config& c, int world, int ranks_per_node, const Machine& m) {
  YUAN_CHECK(ranks_per_node >= 1, "planner: %d ranks per node", ranks_per_node);
  const Device device = m.cpu() ? Device::Cpu : Device::Cuda;
  // optim.offload resolved as the trainer resolves it (train/memory_plan.h choose_offload), the machine's memory
  // in place of the node's: where auto leaves it to the memory, none if the layout fits with the state on the
  // device, else host.
  const Offload settled = settled_offload(c, device).offload;  // none refused where the trainer refuses it
  if (c.optim.offload == Offload::Auto) {
    Config resolved = c;
    resolved.optim.offload = settled == Offload::Auto ? Offload::None : settled;
    const Prediction p = predict(resolved, world, ranks_per_node, m);
    if (settled != Offload::Auto || p.fits) return p;
    resolved.optim.offload = Offload::Host;
    return predict(resolved, world, ranks_per_node, m);
  }
  layout::validate(c, world);
  const layout::Topology topo = layout::make_topology(c, world);
  const int on_node = std::min(ranks_per_node, world);
  // A cpu host's ranks share its cores, memory and bandwidth: one node's, or several nodes' where they run on one
  // host (nodes_per_host, as the test cluster's do). Each rank trains with the threads the trainer gives an unbound
  // rank (util/threads.h: the node's cores over its ranks, at least one).
  const int per_host = m.cpu() ? ranks_per_node * m.nodes_per_host : ranks_per_node;
  const int on_host = std::min(per_host, world);
  const int threads = m.cpu() ? std::max(1, m.host_cores / on_node) : 1;
  Prediction pred;
  pred.offload = c.optim.offload;
  if (!m.cpu() && ranks_per_node > m.devices_per_node) {
    pred.fits = false;
    pred.short_of = strf("ranks: %d per node, but a node has %d devices (%d short)", ranks_per_node,
                         m.devices_per_node, ranks_per_node - m.devices_per_node);
    pred.over = static_cast<double>(ranks_per_node - m.devices_per_node) / m.devices_per_node;
    return pred;
  }
  Rates r;
  r.cpu = m.cpu();
  // A cpu rank alone gets its threads' cores of the host's; the simulation shares them out where ranks want more.
  const double share = m.cpu() ? static_cast<double>(m.host_cores) / threads : 1;
  // GEMMs and attention run on the tensor cores at the clock the GPU holds under load (sustained_clock, 1 on cpu).
  r.gemm = m.peak_flops * m.sustained_clock * m.gemm_efficiency / share;
  r.half = m.gemm_half_flops;
  const AttentionCharge attention = attention_charge(c, m);
  r.attention = m.peak_flops * m.sustained_clock * attention.efficiency / share;
  // Own backward (cuda/attention.cu) runs seven products, its kv and q kernels each recomputing S and dP (kv: S,
  // dP, dV, dK; q: S, dP, dQ); cuDNN's runs FlashAttention-2's five (S, dP, dV, dK, dQ: ops/op_cost.h
  // attention_backward_cost), the count its quoted rates are per.
  r.attention_backward = attention.path == AttentionPath::Cudnn ? 2.5 : 3.5;
  r.mem_bw = m.mem_bw * m.mem_efficiency / share;
  if (m.cpu()) {
    r.cpu_attention = m.attention_flops / share;
    r.gelu = m.gelu_rate / share;
    r.softmax = m.softmax_rate / share;
  }
  r.launch = m.launch_s;
  r.sms = m.sm_count;
  r.host_bw = m.host_mem_bw / (m.cpu() ? on_host : on_node);
  r.act = static_cast<double>(dtype_size(tensor_formats(device).activations));
  r.weights = tensor_formats(device).weights;
  r.weight = static_cast<double>(dtype_size(r.weights));
  const Links links{m, ranks_per_node, m.cpu() ? std::min(1.0, static_cast<double>(m.host_cores) / on_host) : 1.0};
  const layout::ScheduleKind kind = layout::parse_schedule(c.parallel.schedule);
  const int T = topo.tp_size();

  // Per pipeline, per stage: times and memory from the stage's first tensor rank (its tensor ranks are alike).
  struct StagePlan {
    StageTimes times;
    RankMemory memory;
    RankPlan plan;
    int rank = 0;
  };
  // Pipelines alike: the same template, micro-batches and placement of their groups on nodes (which links they use).
  struct Alike {
    std::vector<StagePlan> plans;
    std::vector<StageTimes> times;
    Simulation sim;
    int micro_batches = 0;
  };
  std::map<std::tuple<std::string, int, std::string>, Alike> alike;
  std::vector<Alike*> of_pipeline;
  const auto crosses = [&](int a, int b) { return a / ranks_per_node != b / ranks_per_node; };
  for (size_t p = 0; p < topo.pipelines().size(); p++) {
    const layout::Pipeline& pl = topo.pipelines()[p];
    const int stages = static_cast<int>(pl.stages.size());
    std::string placement;
    for (int s = 0; s < stages; s++) {
      const int rank = topo.rank_of({static_cast<int>(p), s, 0});
      placement += crosses(rank, rank + T - 1) ? 'T' : 't';
      placement += s + 1 < stages && crosses(rank, rank + T) ? 'S' : 's';
    }
    auto [it, added] = alike.try_emplace(std::make_tuple(pl.name, pl.micro_batches, placement));
    Alike& a = it->second;
    if (added) {
      for (int s = 0; s < stages; s++) {
        const int rank = topo.rank_of({static_cast<int>(p), s, 0});
        StagePlan sp{{}, {}, plan_rank(c, topo, device, rank), rank};
        sp.memory = sp.plan.memory;
        sp.times = stage_times(c.model, pl.stages[s], c.train.micro_batch, c.train.recompute, T,
                               links.of(topo.tensor_ranks(rank)), r);
        if (s + 1 < stages) {
          const std::vector<int> pair = {rank, topo.rank_of({static_cast<int>(p), s + 1, 0})};
          sp.times.send_s = collective_s(Collective::SendRecv, r.act * c.train.micro_batch * c.model.seq_len *
                                                                   c.model.n_embd, 2, links.of(pair));
        }
        a.times.push_back(sp.times);
        a.plans.push_back(std::move(sp));
      }
      a.micro_batches = pl.micro_batches;
    }
    of_pipeline.push_back(&a);
  }
  // The schedules. Where no host's ranks want more cores than it has, every rank runs at its full rate and alike
  // pipelines run alike: each simulated once. Else the pipelines that share cores fill each other's bubbles: all
  // are simulated together, each stage in the hosts its tensor ranks run on.
  std::vector<const Simulation*> sim_of(of_pipeline.size());
  std::vector<Simulation> joint;
  if (m.cpu() && on_host * threads > m.host_cores) {
    std::vector<SharedPipeline> shared;
    for (size_t p = 0; p < of_pipeline.size(); p++) {
      SharedPipeline sp{of_pipeline[p]->times, {}, of_pipeline[p]->micro_batches};
      for (size_t s = 0; s < sp.stages.size(); s++) {
        std::map<int, int> on;  // ranks by host
        const int rank = topo.rank_of({static_cast<int>(p), static_cast<int>(s), 0});
        for (int t = rank; t < rank + T; t++) on[t / per_host]++;
        sp.pools.emplace_back(on.begin(), on.end());
      }
      shared.push_back(std::move(sp));
    }
    const std::vector<CorePool> hosts((world + per_host - 1) / per_host,
                                      CorePool{static_cast<double>(m.host_cores), static_cast<double>(threads)});
    joint = simulate(kind, shared, hosts);
    for (size_t p = 0; p < joint.size(); p++) sim_of[p] = &joint[p];
  } else {
    for (auto& entry : alike) entry.second.sim = simulate(kind, entry.second.times, entry.second.micro_batches);
    for (size_t p = 0; p < of_pipeline.size(); p++) sim_of[p] = &of_pipeline[p]->sim;
  }
  double makespan = 0;
  int slowest = 0;
  for (size_t p = 0; p < sim_of.size(); p++)
    if (sim_of[p]->makespan > makespan) {
      makespan = sim_of[p]->makespan;
      slowest = static_cast<int>(p);
    }

  // Memory: every device against its capacity, every host's ranks against its memory.
  std::vector<double> node_host((world + per_host - 1) / per_host, 0.0);
  double worst_device = 0;
  int worst_device_rank = 0;
  for (int rank = 0; rank < world; rank++) {
    const layout::Place& place = topo.place(rank);
    const RankMemory& mem = of_pipeline[place.pipeline]->plans[place.stage].memory;
    node_host[rank / per_host] += static_cast<double>(mem.host_bytes() + kRankMemoryMargin);
    const double dev = device == Device::Cpu ? 0 : static_cast<double>(mem.device_bytes() + kRankMemoryMargin);
    if (dev > worst_device) {
      worst_device = dev;
      worst_device_rank = rank;
      pred.device_optimizer_bytes = static_cast<double>(mem.device_optimizer);
    }
  }
  const auto fullest = std::max_element(node_host.begin(), node_host.end());
  pred.device_bytes = worst_device;
  pred.host_bytes = *fullest;
  std::vector<std::string> short_of;
  if (device != Device::Cpu && worst_device > m.mem_bytes) {
    short_of.push_back(strf("device memory: rank %d needs %s of a %s device (%s short)", worst_device_rank,
                            gib(worst_device).c_str(), gib(m.mem_bytes).c_str(),
                            gib(worst_device - m.mem_bytes).c_str()));
    pred.over = std::max(pred.over, worst_device / m.mem_bytes - 1);
  }
  if (*fullest > m.host_mem_bytes) {
    const int host = static_cast<int>(fullest - node_host.begin());
    const std::string whose = per_host == ranks_per_node
                                  ? strf("node %d", host)
                                  : strf("host %d (nodes %d-%d)", host, host * m.nodes_per_host,
                                         (host + 1) * m.nodes_per_host - 1);
    short_of.push_back(strf("host memory: %s's ranks need %s of %s (%s short)", whose.c_str(), gib(*fullest).c_str(),
                            gib(m.host_mem_bytes).c_str(), gib(*fullest - m.host_mem_bytes).c_str()));
    pred.over = std::max(pred.over, *fullest / m.host_mem_bytes - 1);
  }
  for (const std::string& s : short_of) pred.short_of += (pred.short_of.empty() ? "" : "; ") + s;
  pred.fits = short_of.empty();

  // The step: the slowest pipeline's schedule, then the slowest stage's collectives and optimizer (the data groups
  // join every pipeline, so each waits for the last to finish its schedule). Pipelines alike are counted once.
  After worst;
  for (const auto& entry : alike)
    for (const StagePlan& sp : entry.second.plans) {
      const After a = after_schedule(c, topo, sp.rank, sp.plan, sp.times, entry.second.micro_batches, links, r,
                                     m.pcie_bw, makespan);
      if (a.comm + a.optimizer > worst.comm + worst.optimizer) worst = a;
    }
  // The split on the busiest stage of the slowest pipeline: its passes, and the rest of the schedule idle.
  const std::vector<StagePlan>& plans = of_pipeline[slowest]->plans;
  const Simulation& sim = *sim_of[slowest];
  const int busiest = static_cast<int>(std::max_element(sim.busy.begin(), sim.busy.end()) - sim.busy.begin());
  const StageTimes& bt = plans[busiest].times;
  const double m_b = topo.pipelines()[slowest].micro_batches;
  // Its passes' time less their communication is their compute, at the share of the cores the stage got.
  const double inner_comm = m_b * (bt.forward.comm + bt.backward.comm);
  pred.split.compute = sim.busy[busiest] - inner_comm;
  pred.split.comm = inner_comm + worst.comm;
  pred.split.bubble = makespan - sim.busy[busiest];
  pred.split.optimizer = worst.optimizer;
  // The scalars every rank waits on each step (train.cpp run_step): the loss and the squared gradient norm summed
  // over the world (two all-reduces of a double), the step time and every stage's busy and span seconds gathered to
  // rank 0 (three gathers up a binomial tree).
  std::vector<int> everyone(world);
  for (int i = 0; i < world; i++) everyone[i] = i;
  const LinkClass world_link = links.of(everyone);
  const double syncs = 2 * collective_s(Collective::AllReduce, 8, world, world_link) +
                       3 * std::ceil(std::log2(world)) * world_link.latency_s;
  pred.split.comm += syncs;
  pred.step_s = makespan + worst.comm + worst.optimizer + syncs;
  const double tokens = static_cast<double>(c.train.global_batch) * c.model.seq_len;
  pred.tokens_per_s = tokens / pred.step_s;
  const double peak = m.cpu() ? m.peak_flops * node_host.size() : m.peak_flops * world;
  pred.mfu = pred.tokens_per_s * flops_per_token(c.model, ParamLayout(c.model).total()) / peak;
  return pred;
}

}  // namespace yuan::planner
