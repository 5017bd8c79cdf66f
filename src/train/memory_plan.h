// What a rank of a job will allocate, by purpose, and the check that refuses a job before it allocates what its
// nodes do not have. `yuanlm plan` prints plan_rank's memory; the trainer builds its replica from the same plan and
// checks the same figures (one derivation), so a
// deck that plan says needs more than a node has is refused in a second instead of being killed by the kernel
// minutes later. The parts come from the plans the trainer allocates by: program/program.h plan_memory (the backend
// and the program), optim/zero.h zero_host_memory (optimizer state and staging), data/loader.h (read-ahead).
#pragma once
#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "config/config.h"
#include "layout/topology.h"
#include "optim/zero.h"
#include "program/program.h"

namespace yuan {

struct RankMemory {
  Device device = Device::Cpu;  // where `on_device` lives (on the cpu backend that is host memory too)
  size_t params = 0;            // parameters of the stage, this tensor rank's part
  MemoryPlan on_device;         // working weights, fp32 gradients, activations, buffers
  ZeroHostMemory host;          // optimizer state and its transfer staging (host)
  size_t device_optimizer = 0;  // optim.offload = none: the optimizer state on the device
  size_t data = 0;              // the loaders' buffers (host)
  // ckpt.local_every > 0 (train/local_store.h): the node-local storage of two generations of the rank's shards and of
  // the partner copy it keeps (/dev/shm by default: host memory too), copied and received straight into its files.
  size_t local_storage = 0;
  size_t host_bytes() const;    // everything in host memory
  size_t device_bytes() const;  // everything in device memory (0 on the cpu backend)
  size_t total() const {
    return on_device.total() + device_optimizer + host.optimizer + host.staging + data + local_storage;
  }
};

// Everything rank `rank` of the job of `c` on `topo` sets up on `device`, derived once (needs no device).
struct RankPlan {
  ParamLayout layout;   // its stage's modules, this tensor rank's part of them
  BackendSpec backend;  // the layout's parameters, or ZeRO-3's shard elements of them
  ProgramSpec program;  // its stage, the micro-batch, the micro-batches kept at once, recompute, tensor ranks
  RankMemory memory;    // what it allocates
  AttentionChoice attention;  // whose attention kernels (model.attention), and why
};
RankPlan plan_rank(const Config& c, const layout::Topology& topo, Device device, int rank);

// What the process itself needs beyond the plan (MPI's buffers, the libraries' workspaces, thread stacks; on the
// device NCCL's and cuBLAS's): counted for every rank, on the host and on the device.
constexpr size_t kRankMemoryMargin = size_t{256} << 20;

// Collective over the world, before anything large is allocated: sums `mine` over the ranks that share this node
// (host memory, against util/memory.h node_available_memory) and, on cuda, over the ranks that share device
// `device_index` (against its free memory). Where any node or device is short, every rank throws the same
// collective Error: "memory: ... need X GiB of host memory (params ..., grads ..., optimizer ..., activations ...,
// buffers ..., data ..., staging ..., margin ... GiB; ...), and it has Y GiB available (source); try <hint>".
void check_node_memory(const RankMemory& mine, int device_index, const std::string& hint);
// The same test, without throwing: "" where every node and device has what its ranks need, else the lowest
// rank's shortfall (the same on every rank). Collective over the world.
std::string node_memory_problem(const RankMemory& mine, int device_index);

// Where the job's optimizer state lives (optim.offload resolved), and why: `offload` is Host or None.
struct OffloadChoice {
  Offload offload = Offload::Auto;
  std::string why;
};
// optim.offload where no memory plan decides it: host or none as asked (none refused, naming the reason, on the cpu
// backend), host for auto on the cpu backend; `offload` Auto where auto leaves it to the memory (choose_offload
// asks the node's, the planner its machine's).
OffloadChoice settled_offload(const Config& c, Device device);
// optim.offload for rank `rank` of the job of `c` on `topo` with its device `device_index`: settled_offload, and
// where that leaves it open none where every rank's plan with the state on its device passes node_memory_problem's
// test, else host. Collective over the world where auto asks the plan.
OffloadChoice choose_offload(const Config& c, const layout::Topology& topo, Device device, int rank,
                             int device_index);

// What a training job of `c` on `world` ranks can change to need less memory, for the parts that weigh in a
// rank's plan `m`, as a hint for check_node_memory.
std::string memory_hint(const Config& c, int world, const RankMemory& m);

}  // namespace yuan
