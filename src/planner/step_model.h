// The step-time model: how long one optimizer step of a deck's layout takes on a machine (planner/machine.h),
// built from the same per-rank derivation the trainer allocates by (train/memory_plan.h plan_rank): each stage's
// modules, tensor part, micro-batch, recompute, module groups and ZeRO shards.
//   compute   per op from its FLOPs and bytes: GEMMs (cuBLASLt on cuda) at the rate their size reaches
//             (gemm_efficiency x peak, falling off below gemm_half_flops; on cuda their output tiles run in waves
//             over sm_count SMs, gemm_wave_efficiency, and the tensor cores at sustained_clock); attention on cuda on
//             the path the run takes (attention_charge: this project's own flash-style kernel, assumed to reach
//             what FlashAttention-2 reaches on the device, attention_efficiency x peak, or cuDNN's fused one at
//             cudnn_attention_efficiency x peak), on the cpu backend causal loops per head at the rate the op was
//             measured at (attention_flops; the GEMM rate when not measured); on cpu GELU and the classifier's
//             softmax at their measured tanh / exp-bound rates (gelu_rate, softmax_rate) when given;
//             memory-bound ops (layernorm, GELU, residuals, softmax, embedding; this project's own one-pass
//             kernels, assumed to stream like STREAM's triad) at mem_efficiency x mem_bw; on cuda launch_s of
//             device idle per kernel a block launches; on a cpu node each rank computes at its threads' share
//             of the node's rate and bandwidth (the trainer's threads: the node's cores over its ranks)
//   comm      alpha-beta per link class (a group crossing nodes runs at [link.inter], group_link): ring
//             reduce-scatter and all-gather, ring or tree all-reduce, whichever is faster (as NCCL's tuner and
//             Open MPI's decision rules choose), send/recv; tensor-parallel all-reduces sit inside each pass,
//             pipeline sends between; on a cpu host whose ranks outnumber its cores, each link at the share of a
//             core its rank gets (the ranks copy their messages' bytes themselves)
//   schedule  every pipeline's 1F1B or GPipe order (layout/schedule.h) simulated with those pass times, so the
//             bubble comes out of the simulation; the step waits for the slowest pipeline. Where a cpu host's ranks
//             want more cores than it has, all its pipelines are simulated together, sharing the cores among the
//             ranks computing at each moment (a rank waiting for a message yields its core to the others)
//   after     the data groups' gradient reductions and weight gathers (hidden behind backward on cuda where the
//             optimizer overlaps, exposed on the cpu backend, whose collectives block the rank's only thread),
//             ZeRO-3's per-module gathers (prefetched behind compute on cuda), and the optimizer where
//             optim.offload puts it: none (cuda), the GPU AdamW and the shard's gradient-norm pass at
//             mem_efficiency x mem_bw, the bytes of ops/op_cost.h adamw_cost and grad_norm_cost (at zero 3 also
//             each micro-batch's reduced shard written or added into the device gradient shard), nothing over
//             PCIe; host, the host AdamW at host_mem_bw and the offload transfers at pcie_bw (the AdamW behind the
//             next step with optim.delayed_update), at zero 2 and 3 the gradients down every micro-batch and
//             summed on the host (at host_mem_bw), the gradient-norm pass on the host before AdamW; and the scalars
//             every rank waits on each step (the loss and norm sums, the step-time and bubble gathers) at the world
//             group's latency
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "backend/ops_interface.h"
#include "config/config.h"
#include "layout/schedule.h"
#include "planner/machine.h"

namespace yuan::planner {

// Whose attention kernels a run of `c` takes on `m`, as the step model charges them: the path choose_attention
// takes for model.attention on m's kind of device (with no GPU visible, the build and the head size decide), at
// cudnn_attention_efficiency where that is cuDNN's and m gives it, else this project's at attention_efficiency
// (what the run takes where cuDNN's does not run, as below sm_80). Throws Error for model.attention = cudnn on a
// machine without cudnn_attention_efficiency, naming `file` (m's name when empty) and the key.
struct AttentionCharge {
  AttentionPath path = AttentionPath::Own;  // the kernels charged
  double efficiency = 0;                    // their fraction of peak_flops
  std::string why;                          // which key, and why that path
};
AttentionCharge attention_charge(const Config& c, const Machine& m, const std::string& file = "");

enum class Collective { AllReduce, ReduceScatter, AllGather, SendRecv };
// Seconds for `ranks` ranks to run `op` over a buffer of `bytes` each rank passes (the whole buffer, as the
// trainer's comm_bytes counts it) on `link`:
//   ring all-gather / reduce-scatter  (D-1) alpha + (D-1)/D n / bw
//   ring all-reduce                   2 (D-1) alpha + 2 (D-1)/D n / bw
//   tree all-reduce                   2 ceil(log2 D) alpha + 2 n / bw      (the faster of ring and tree is used)
//   send/recv                         alpha + n / bw
double collective_s(Collective op, double bytes, int ranks, const LinkClass& link);

// The share of `sms` SMs' time a GEMM with an m x n output keeps busy on cuda (NVIDIA, "Matrix Multiplication
// Background User's Guide", sec. 3 "Dimension Quantization Effects"): an edge tile computes its whole size (tile
// quantization), and the tiles run one per SM at a time, so the GEMM takes ceil(tiles / SMs) full waves, the last one
// partly idle (wave quantization). With fewer tiles than SMs the libraries split K over the idle SMs (split-K,
// stream-K), and only the tiles' padding counts. The best of cuBLAS's large tiles (256x128, 128x256, 128x128), as its
// heuristics pick one per shape. 1 when sms is 0 (a cpu).
double gemm_wave_efficiency(int sms, double m, double n);

// The link a group of `ranks` (world ranks, `ranks_per_node` consecutive ones on each node) runs at: [link.intra]
// inside one node; across nodes, [link.inter]'s latency and its bandwidth times the group's fewest members on a
// node (they share their ports: a ring crosses each node boundary once per channel), at most [link.intra]'s; a cpu
// node has one port, so its groups cross at [link.inter]'s bandwidth.
LinkClass group_link(const Machine& m, const std::vector<int>& ranks, int ranks_per_node);

// One pass of one micro-batch on a stage: its compute, and the communication inside it (tensor parallelism).
struct PassTimes {
  double compute = 0, comm = 0;
  double total() const { return compute + comm; }
};
struct StageTimes {
  PassTimes forward, backward;
  double send_s = 0;  // the activation (forward) or its gradient (backward) between this stage and the next
};
struct Simulation {
  double makespan = 0;        // from the first forward to the last backward of the step
  std::vector<double> busy;   // per stage: time spent in passes (at the share of the cores it got)
};
// Every stage walks its Schedule's actions in order; a forward waits for the previous stage's forward of the same
// micro-batch (plus its send), a backward for the next stage's backward (plus the send back). Each stage runs at
// its full rate: the times are what its passes take.
Simulation simulate(layout::ScheduleKind kind, const std::vector<StageTimes>& stages, int micro_batches);

// Cores that ranks share (processor sharing): a cpu host's. A rank computing uses up to `threads` of them; while
// more are wanted than there are, the computing ranks share them evenly, and a rank waiting for its input (or in a
// pass's communication) wants none: with Open MPI's mpi_yield_when_idle its core goes to the others.
struct CorePool {
  double cores = 1, threads = 1;
};
// One pipeline of a joint simulation: its stages' times at a rank's full rate (`threads` cores), and per stage the
// pools its ranks run in (pool index, ranks of the stage there; none: a device of its own, always at full rate).
struct SharedPipeline {
  std::vector<StageTimes> stages;
  std::vector<std::vector<std::pair<int, int>>> pools;
  int micro_batches = 1;
};
// All pipelines at once, event by event: a stage's compute advances at min(1, cores / (threads x ranks computing
// in its pool)) of its full rate (the least over its pools), its passes' communication and sends at their own
// times. One Simulation per pipeline; its makespan is when its last pass ends.
std::vector<Simulation> simulate(layout::ScheduleKind kind, const std::vector<SharedPipeline>& pipelines,
                                 const std::vector<CorePool>& pools);

// Where the step goes, on the stage that sets its length: the split sums to step_s.
struct StepSplit {
  double compute = 0;    // its passes' compute (recompute included), at the share of the cores it got
  double comm = 0;       // exposed communication: tensor all-reduces, data reductions and gathers not hidden
  double bubble = 0;     // idle time in the schedule, from the simulation
  double optimizer = 0;  // the AdamW and its gradient norm (on the device or the host) and the offload transfers,
                         // what is not hidden
};

struct Prediction {
  bool fits = true;
  std::string short_of;   // when !fits: what is short, and by how much
  double over = 0;        // when !fits: the largest shortfall as a share of what is available (for ranking)
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  StepSplit split;
  Offload offload = Offload::Auto;  // where the optimizer state is: None (the devices) or Host (optim.offload resolved)
  double device_bytes = 0;  // the fullest device (cuda; 0 on cpu), plan_rank's figure plus the per-rank margin
  double device_optimizer_bytes = 0;  // of it, the optimizer state (offload none; 0 with host)
  double host_bytes = 0;    // the fullest node's host memory (host's, where nodes share one: nodes_per_host)
};

// The step of the job of `c` (its layout as the trainer would build it) on `world` ranks, `ranks_per_node`
// consecutive ranks on each node of `m`. optim.offload = auto is resolved as the trainer resolves it: none where the
// layout fits with the state on the device (cuda), else host. Throws Error when the deck's layout is
// invalid for `world` (or asks for none where the trainer refuses it).
Prediction predict(const Config& c, int world, int ranks_per_node, const Machine& m);

}  // namespace yuan::planner
