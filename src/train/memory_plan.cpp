#include "train/memory_plan.h"

#include <algorithm>
#include <vector>

#include "comm/world.h"
#include "data/loader.h"
#include "layout/layout.h"
#include "layout/schedule.h"
#include "util/memory.h"

namespace yuan {

size_t RankMemory::host_bytes() const {
  return host.optimizer + host.staging + data + local_storage +
         (device == Device::Cpu ? on_device.total() : 0);
}

size_t RankMemory::device_bytes() const { return device == Device::Cpu ? 0 : on_device.total() + device_optimizer; }

RankPlan plan_rank(const Config& c, const layout::Topology& topo, Device device, int rank) {
  const layout::Place& place = topo.place(rank);
  const layout::Pipeline& pl = topo.pipelines()[place.pipeline];
  const int stages = static_cast<int>(pl.stages.size());
  const ModuleRange& range = pl.stages[place.stage];
  const TensorParallel tp{place.tp_rank, topo.tp_size()};
  const AttentionChoice attention = choose_attention(device, c.model);
  check_op_constraints(c.model, device, attention.path);
  RankPlan plan{ParamLayout(c.model, held_modules(c.model, range), tp), {}, {}, {}, attention};
  const ParamLayout& held = plan.layout;
  const layout::Schedule schedule(layout::parse_schedule(c.parallel.schedule), place.stage, stages,
                                    pl.micro_batches);
  plan.program = {range, c.train.micro_batch, schedule.slots(), c.train.recompute, tp.size, attention.path};
  const DType weights = tensor_formats(device).weights;
  RankMemory& m = plan.memory;
  m.device = device;
  m.params = held.total();
  std::optional<size_t> shards;  // ZeRO-3: this rank's shard elements
  for (const ModuleRange& g : topo.module_groups_of(rank)) {
    const std::vector<int> holders = topo.holders(g.first, place.tp_rank);
    const int group_rank = static_cast<int>(std::find(holders.begin(), holders.end(), rank) - holders.begin());
    // The optimizer's own derivation, whose buffers its constructor allocates.
    const ZeroSpec z(held, g, c.optim, static_cast<int>(holders.size()), group_rank, topo.replicas_only(), weights);
    const ZeroHostMemory h = zero_host_memory(z.sizes());
    m.host.optimizer += h.optimizer;
    m.host.staging += h.staging;
    m.device_optimizer += zero_device_memory(z.sizes());
    // What a checkpoint holds of the group (zero 0: its rank 0 writes the whole state): master, exp_avg, exp_avg_sq.
    if (c.ckpt.local_every > 0 && (c.optim.zero.shards_optimizer_state() || group_rank == 0)) {
      // Two generations of the own copy and of the partner copy, the latter taken to be the size of the own (the
      // same local rank of a node alike).
      m.local_storage += 2 * 2 * 3 * sizeof(float) * z.shard_n;
    }
    if (c.optim.zero.shards_weights()) shards = z.shard_n;  // one module group (validate)
  }
  plan.backend = backend_spec(held, shards);
  plan.backend.attention = attention.path;
  m.on_device = plan_memory(device, c.model, plan.program, zero_param_memory(held, shards));
  // Both ends of a pipeline read its micro-batches (the trainer's loaders).
  if (range.first == kWteModule || range.end == module_count(c.model)) {
    LoaderSpec spec;
    spec.seq_len = c.model.seq_len;
    spec.micro_batch = c.train.micro_batch;
    spec.prefetch = c.data.prefetch;
    m.data = train_loader_bytes(spec) + (c.data.val.empty() ? 0 : val_loader_bytes(spec));
  }
  return plan;
}

std::string memory_hint(const Config& c, int world, const RankMemory& m) {
  // What would shrink the parts that weigh (an eighth of the rank's need or more); more nodes always help.
  const size_t total = m.total() + kRankMemoryMargin;
  const auto weighs = [&](size_t part) { return part >= total / 8; };
  const size_t model = m.on_device.weights + m.on_device.grads + m.device_optimizer + m.host.optimizer + m.host.staging;
  const size_t activations = m.on_device.activations + m.on_device.buffers;
  std::vector<std::string> tries;
  if (!c.optim.zero.shards_weights() && world > 1 && weighs(model))
    tries.push_back(
        strf("a higher optim.zero (now %d; 3 shards the weights and gradients too)", c.optim.zero.number()));
  if (weighs(m.device_optimizer)) tries.push_back("optim.offload = host (the optimizer state in host memory)");
  if (!c.train.recompute && weighs(m.on_device.activations)) tries.push_back("train.recompute=true");
  if (c.train.micro_batch > 1 && weighs(activations))
    tries.push_back(strf("a smaller train.micro_batch (now %d)", c.train.micro_batch));
  else if (weighs(activations))
    tries.push_back(strf("a smaller model.seq_len (now %d)", c.model.seq_len));
  if (weighs(m.data)) tries.push_back(strf("a smaller data.prefetch (now %d)", c.data.prefetch));
  tries.push_back("more ranks over more nodes (fewer ranks per node)");
  std::string s;
  for (size_t i = 0; i < tries.size(); i++) s += (i == 0 ? "" : i + 1 == tries.size() ? " or " : ", ") + tries[i];
  return s;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The parts of a rank's memory in one place (host or device), summed over the ranks that share it.
enum Part { kParams, kGrads, kOptimizer, kActivations, kBuffers, kData, kStaging, kLocal, kMargin, kParts };
constexpr const char* kPartNames[kParts] = {"params", "grads",   "optimizer",         "activations",
                                            "buffers", "data", "staging", "local checkpoints", "margin"};
using Parts = std::vector<unsigned long long>;

Parts host_parts(const RankMemory& m) {
  Parts p(kParts);
  if (m.device == Device::Cpu) {
    p[kParams] = m.on_device.weights;
    p[kGrads] = m.on_device.grads;
    p[kActivations] = m.on_device.activations;
    p[kBuffers] = m.on_device.buffers;
  }
  p[kOptimizer] = m.host.optimizer;
  p[kStaging] = m.host.staging;
  p[kData] = m.data;
  p[kLocal] = m.local_storage;
  p[kMargin] = kRankMemoryMargin;
  return p;
}

Parts device_parts(const RankMemory& m) {
  Parts p(kParts);
  p[kParams] = m.on_device.weights;
  p[kGrads] = m.on_device.grads;
  p[kActivations] = m.on_device.activations;
  p[kBuffers] = m.on_device.buffers;
  p[kOptimizer] = m.device_optimizer;
  p[kMargin] = kRankMemoryMargin;
  return p;
}

// "" when `need`, summed over `ranks` ranks, fits in `available` bytes of `what`, else what does not fit.
std::string shortfall(const Parts& need, int ranks, const std::string& where, const char* what, size_t available,
                      const std::string& source) {
  unsigned long long total = 0;
  for (unsigned long long b : need) total += b;
  if (total <= available) return "";
  std::string parts;
  for (int i = 0; i < kParts; i++)
    if (need[i] > 0) parts += strf("%s%s %.2f", parts.empty() ? "" : ", ", kPartNames[i], need[i] / kGiB);
  return strf("%s %s need%s %.2f GiB of %s (%s GiB; the margin is %zu MiB per rank for what MPI and the libraries "
              "allocate beside the plan), and it has %.2f GiB available (%s)",
              ranks == 1 ? "the rank on" : strf("the %d ranks on", ranks).c_str(), where.c_str(),
              ranks == 1 ? "s" : "", total / kGiB, what, parts.c_str(), kRankMemoryMargin >> 20, available / kGiB,
              source.c_str());
}

}  // namespace

std::string node_memory_problem(const RankMemory& mine, int device_index) {
  const comm::WorldInfo& w = comm::world();
  // The node's ranks, and among them those of this rank's device (every rank takes part, cpu ones too, so that no
  // rank waits in a sum the others skip). The node's figures are read once all of its ranks have arrived (the sums),
  // before any of them allocates.
  int node_ranks = 0, device_ranks = 0;
  const Parts host = comm::sum_on_node(host_parts(mine), "node", &node_ranks);
  const Parts dev = comm::sum_on_node(device_parts(mine), std::max(device_index, 0), "device", &device_ranks);
  const NodeMemory avail = node_available_memory();
  const std::string where = comm::node_map().label(w.node);
  std::string problem = shortfall(host, node_ranks, where, "host memory", avail.available, avail.source);
  if (problem.empty() && mine.device != Device::Cpu)
    problem = shortfall(dev, device_ranks, strf("%s device %d of %s", device_name(mine.device), device_index,
                                                where.c_str()),
                        "device memory", device_free_bytes(mine.device), "free on the device");
  // The lowest rank that found a shortfall speaks for every rank.
  return comm::first_problem(problem);
}

void check_node_memory(const RankMemory& mine, int device_index, const std::string& hint) {
  const std::string message = node_memory_problem(mine, device_index);
  if (!message.empty()) throw Error(strf("memory: %s; try %s", message.c_str(), hint.c_str()), true);
}

OffloadChoice settled_offload(const Config& c, Device device) {
  const Offload asked = c.optim.offload;
  if (device == Device::Cpu) {
    if (asked == Offload::None)
      throw Error("optim.offload = none: the cpu backend keeps the optimizer in host memory, which is its device "
                  "memory too (use host or auto, or train.device = cuda)", true);
    return {Offload::Host, "the cpu backend's memory is the host's"};
  }
  if (asked != Offload::Auto) return {asked, std::string("optim.offload = ") + name_of(asked)};
  return {};
}

OffloadChoice choose_offload(const Config& c, const layout::Topology& topo, Device device, int rank,
                             int device_index) {
  const OffloadChoice settled = settled_offload(c, device);
  if (settled.offload != Offload::Auto) return settled;
  Config on_device = c;
  on_device.optim.offload = Offload::None;
  const RankMemory m = plan_rank(on_device, topo, device, rank).memory;
  const std::string problem = node_memory_problem(m, device_index);
  if (problem.empty())
    return {Offload::None, strf("optim.offload = auto: the state fits on the device (%.2f GiB of this rank's %.2f)",
                         m.device_optimizer / kGiB, m.device_bytes() / kGiB)};
  return {Offload::Host, "optim.offload = auto: the device would not hold it: " + problem};
}

}  // namespace yuan
