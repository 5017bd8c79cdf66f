// A machine, as the step-time model (planner/step_model.h) sees it: what one node's devices compute and hold, its
// host, and the two classes of link ranks talk over (inside a node, across nodes). `yuanlm plan --machine FILE`
// reads it; `yuanlm plan --calibrate --out FILE` writes one for the machine it runs on.
//
// Format (input/machines/*.ini): INI sections [machine], [device], [host], [link.intra], [link.inter], one
// `key = value` a line, and every number carries where it comes from in a trailing comment, either
//   peak_flops = 989e12   # source: NVIDIA H100 SXM datasheet, dense BF16
// or
//   mem_bw = 9.1e9        # measured: STREAM-like triad, 2 ranks, 2026-11-25, host ci-vm
// so that a prediction can always be traced to a datasheet or a measurement. Every key must be given once;
// unknown, repeated, malformed or unsourced keys are errors naming the file, the line and the key. Three [device]
// keys describe what the cuda backend's own kernels reach (attention_efficiency, mem_efficiency, launch_s), two more
// the GPU itself (sm_count, sustained_clock): a cuda machine must give them; a cpu machine may leave them out (its
// rates are measured on the cpu backend's own ops, and it launches nothing), and then takes the neutral values below. Three more describe the cpu backend's own
// loops that are neither GEMMs nor memory-bound (attention_flops, gelu_rate, softmax_rate, measured by `--calibrate`):
// any machine may leave them out, and 0 (not measured) charges those ops as before (attention at the GEMM rate,
// GELU and the classifier's softmax at memory bandwidth); only a cpu machine uses them. [machine] nodes_per_host
// (optional, 1 when left out; only a cpu machine uses it) says that several nodes of the launch run on one host, as
// `--calibrate` finds when their ranks read one kernel boot id: their ranks share one host's cores.
// [device] cudnn_attention_efficiency (optional, 0 when left out) is attention_efficiency for cuDNN's fused
// attention (model.attention, backend/backend.h choose_attention): left out where it does not run (below sm_80, a
// cpu), and then every run is charged at attention_efficiency.
#pragma once
#include <map>
#include <string>

namespace yuan::planner {

struct LinkClass {
  double latency_s = 0;  // one message's start-up time (the alpha of alpha-beta)
  double bandwidth = 0;  // bytes/s per rank, one direction (1/beta)
};

struct Machine {
  std::string name;              // [machine] name: free text
  int devices_per_node = 1;      // [machine] devices_per_node: ranks per node by default
  int nodes_per_host = 1;        // [machine] nodes_per_host (optional, cpu): consecutive nodes that run on one host
                                 //   and share its cores, memory and bandwidth (the test cluster's network
                                 //   namespaces); the [device] and [host] figures are then the host's
  std::string kind = "cpu";      // [device] kind: cpu | cuda
  double peak_flops = 0;         // [device] dense FLOP/s at the training dtype per device (cuda: bf16 per GPU;
                                 //   cpu: fp32 of the whole node, shared by the ranks on it)
  double gemm_efficiency = 0;    // [device] fraction of peak_flops large GEMMs reach
  double gemm_half_flops = 0;    // [device] FLOPs of a GEMM that reaches half that rate (smaller ones fall off)
  double mem_bw = 0;             // [device] bytes/s for memory-bound ops per device; cpu: the node's
  double attention_efficiency = 1;  // [device] fraction of peak_flops the flash attention kernels reach (cuda)
  double cudnn_attention_efficiency = 0;  // [device] (optional) the same of cuDNN's fused attention
                                          //   (model.attention); 0: cuDNN's attention does not run there
  double mem_efficiency = 1;     // [device] fraction of mem_bw streaming kernels reach
  double launch_s = 0;           // [device] the device's idle time per kernel, launched back to back on a stream
  int sm_count = 0;              // [device] streaming multiprocessors (cuda): a GEMM's tiles run in waves over them
                                 //   (0 on cpu: no wave quantization)
  double sustained_clock = 1;    // [device] the clock held under sustained tensor-core load, as a fraction of the
                                 //   clock peak_flops is quoted at (cuda: GEMMs and attention run at it)
  double attention_flops = 0;    // [device] FLOP/s of the cpu attention op, forward and backward (node, as peak_flops)
  double gelu_rate = 0;          // [device] elements/s of the cpu GELU, one pass (forward or backward), per node
  double softmax_rate = 0;       // [device] logits/s of the cpu classifier op (softmax and cross-entropy), per node
  double mem_bytes = 0;          // [device] bytes per device (cpu: 0, host memory is the limit)
  double pcie_bw = 0;            // [device] host<->device bytes/s per device (cpu: 0)
  double host_mem_bytes = 0;     // [host] mem_bytes: per node
  double host_mem_bw = 0;        // [host] mem_bw: bytes/s per node
  int host_cores = 1;            // [host] cores: per node (the host's, where nodes_per_host nodes share one)
  LinkClass intra, inter;        // [link.intra] / [link.inter] latency_s, bandwidth

  bool cpu() const { return kind == "cpu"; }
};

// Where each number comes from, by "section.key": the comment after '#', e.g. "source: NVIDIA datasheet" or
// "measured: 2 ranks ping-pong, 2026-11-25, host x".
using MachineSources = std::map<std::string, std::string>;

// Throws Error "FILE:LINE: key 'K': ..." (or "FILE: ..." for a missing key or an unreadable file, "machine file FILE
// is a directory, ..." for a directory).
Machine read_machine(const std::string& path, MachineSources* sources = nullptr);
// The same from text, `file` naming it in errors.
Machine parse_machine(const std::string& text, const std::string& file, MachineSources* sources = nullptr);
// The machine in the file format, every number with its comment from `sources` (each must start with "source:"
// or "measured:"; a missing one is an Error naming the key). parse_machine(machine_text(m, s)) gives m back.
std::string machine_text(const Machine& m, const MachineSources& sources);

}  // namespace yuan::planner
