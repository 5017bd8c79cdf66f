#include "comm/groups.h"

#include <climits>

#include "comm/mpi_group.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#ifdef YUAN_CUDA
#include "comm/nccl.h"
#endif

namespace yuan::comm {

const char* group_name(Group g) {
  switch (g) {
    case Group::World: return "world";
    case Group::Pipeline: return "pipeline";
    case Group::Tensor: return "tensor";
    case Group::Data: return "data";
  }
  return "?";
}

ProcessGroup::Mpi::~Mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm);
}

ProcessGroup::ProcessGroup(std::unique_ptr<Mpi> mpi, std::string name, std::vector<int> world_ranks)
    : mpi_(std::move(mpi)), name_(std::move(name)), ranks_(std::move(world_ranks)) {
  MPI_CHECK(MPI_Comm_set_errhandler(mpi_->comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(mpi_->comm, &rank_));
  int size = 0;
  MPI_CHECK(MPI_Comm_size(mpi_->comm, &size));
  YUAN_CHECK(size == static_cast<int>(ranks_.size()) && ranks_[rank_] == world().rank,
             "process group %s: MPI made %d ranks with this one at %d, the topology says %zu", name_.c_str(), size,
             rank_, ranks_.size());
}

ProcessGroup::~ProcessGroup() = default;

namespace {

// Splits the world into a partition of groups that every rank computes alike; `mine` is the one holding this rank.
std::unique_ptr<ProcessGroup> split(const std::vector<int>& mine, const std::string& name) {
  MPI_Comm comm = MPI_COMM_NULL;
  // The smallest member names the group: unique, and the same on every member.
  Waiting wait("comm_split", "world");
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mine.front(), world().rank, &comm));
  return std::make_unique<ProcessGroup>(std::make_unique<ProcessGroup::Mpi>(comm), name, mine);
}

}  // namespace

ProcessGroups::ProcessGroups(const layout::Topology& topology) : topology_(topology), rank_(world().rank) {
  YUAN_CHECK(topology_.world_size() == world().size, "parallel layout: %d ranks, the job has %d",
             topology_.world_size(), world().size);
  const layout::Place& me = topology_.place(rank_);
  world_ = split(topology_.world_ranks(), "world");
  pipeline_ = split(topology_.pipeline_ranks(rank_), layout::pipeline_group_name(me));
  tensor_ = split(topology_.tensor_ranks(rank_), layout::tensor_group_name(me));
  // One split per module group of the job, in the same order everywhere; ranks outside a group pass
  // MPI_UNDEFINED and get nothing.
  for (const ModuleRange& g : topology_.module_groups()) {
    const std::vector<int> members = topology_.holders(g.first, me.tp_rank);
    const bool in = topology_.holds(rank_, g.first);
    MPI_Comm comm = MPI_COMM_NULL;
    Waiting wait("comm_split", "world");
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, in ? g.first * topology_.tp_size() + me.tp_rank : MPI_UNDEFINED,
                             rank_, &comm));
    if (!in) continue;
    data_.push_back(std::make_unique<ProcessGroup>(std::make_unique<ProcessGroup::Mpi>(comm),
                                                   layout::data_group_name(g), members));
    data_modules_.push_back(g);
  }
}

const ProcessGroup& ProcessGroups::get(Group g, int index) const {
  switch (g) {
    case Group::World: return *world_;
    case Group::Pipeline: return *pipeline_;
    case Group::Tensor: return *tensor_;
    case Group::Data:
      YUAN_CHECK(index >= 0 && index < static_cast<int>(data_.size()), "process groups: rank %d has %zu data groups, "
                 "not %d", rank_, data_.size(), index + 1);
      return *data_[index];
  }
  throw Error("process groups: unknown group");
}

void ProcessGroups::set_device(Device device, DeviceStream producer, double nccl_timeout_s) {
  YUAN_CHECK(comms_.empty(), "process groups: the device of their communicators is set after one was made");
  transport_ = Transport{device, producer, nccl_timeout_s};
}

Communicator& ProcessGroups::communicator(Group g, int index) {
  YUAN_CHECK(transport_, "process groups: %s communicator asked for before set_device", group_name(g));
  const ProcessGroup& group = get(g, index);
  std::unique_ptr<Communicator>& c = comms_[group.world_ranks()];
  const bool made = c == nullptr;
  if (made) c = make_communicator(group, transport_->device, transport_->producer, transport_->nccl_timeout_s);
  if (made || g != Group::World) c->count_into(&traffic_[static_cast<int>(g)]);
  return *c;
}

std::unique_ptr<Communicator> ProcessGroups::gather_communicator(int index) {
  std::unique_ptr<Communicator> c = make_mpi_communicator(get(Group::Data, index), kMpiChunk, true);
  c->count_into(&traffic_[static_cast<int>(Group::Data)]);
  return c;
}

std::unique_ptr<Communicator> make_communicator(const ProcessGroup& group, Device device, DeviceStream producer,
                                                double nccl_timeout_s) {
  // One rank needs no transport, and MPI never touches the (device) buffers then: every collective is the identity.
  if (device == Device::Cpu || group.size() == 1) return make_mpi_communicator(group, kMpiChunk);
#ifdef YUAN_CUDA
  return make_group_nccl_communicator(group, producer, nccl_timeout_s);
#else
  (void)producer, (void)nccl_timeout_s;
  throw Error(strf("%s on %d ranks: data in %s memory needs the NCCL communicator, which this build does not have "
                   "(built: %s)", group.name().c_str(), group.size(), device_name(device), YUAN_BACKENDS));
#endif
}

}  // namespace yuan::comm
