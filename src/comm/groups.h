// Every process group of a job, made in one place from its Topology and asked for by name (as Megatron-core's
// parallel_state): the world, this rank's pipeline and tensor groups, and the data-parallel group of each module
// group this rank holds. Each is an MPI communicator made with MPI_Comm_split over the world, so a group is a real
// MPI group whatever its shape; the tensor traffic runs over a Communicator scoped to it, which ProcessGroups makes
// on first ask and keeps, with an account of the traffic per group.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "layout/topology.h"

namespace yuan::comm {

enum class Group { World, Pipeline, Tensor, Data };
constexpr int kGroups = 4;
const char* group_name(Group g);
// A rank's tensor traffic so far, by Group.
using GroupTraffic = std::array<Traffic, kGroups>;

// One MPI communicator over some of the world's ranks.
class ProcessGroup {
 public:
  struct Mpi;  // the MPI communicator, for comm/'s own files (comm/mpi_group.h)
  ProcessGroup(std::unique_ptr<Mpi> mpi, std::string name, std::vector<int> world_ranks);  // owns mpi
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  const Mpi& mpi() const { return *mpi_; }
  const std::string& name() const { return name_; }           // e.g. "data[h.0-h.3]"
  const std::vector<int>& world_ranks() const { return ranks_; }  // members, by group rank
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }

 private:
  std::unique_ptr<Mpi> mpi_;
  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
};

class ProcessGroups {
 public:
  // Collective over the world: every rank passes the same topology.
  explicit ProcessGroups(const layout::Topology& topology);
  // Not copied or moved: the communicators count into traffic_ by address.
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;
  const layout::Topology& topology() const { return topology_; }
  int rank() const { return rank_; }
  // Group::Data needs `index`: which of this rank's module groups (Topology::module_groups_of(rank)).
  const ProcessGroup& get(Group g, int index = 0) const;
  // The module ranges of this rank's data groups, in index order.
  const std::vector<ModuleRange>& data_modules() const { return data_modules_; }

  // Where the tensor traffic goes: buffers of `device`, each operation after the work enqueued so far on `producer`
  // (make_communicator). Set once, before the first communicator.
  void set_device(Device device, DeviceStream producer, double nccl_timeout_s);
  // The tensor-traffic communicator of a group (`index` as for get), made on first ask (collective over the group
  // then) and kept while the groups live. A group with the same members as another shares its communicator (the
  // data group of plain data parallelism is the world), whose traffic counts for the group other than the world.
  Communicator& communicator(Group g, int index = 0);
  // ZeRO-3's gathers on a thread of their own: MPI over a copy of data group `index`'s communicator
  // (make_mpi_communicator with `duplicate`, collective over the group), counted as that group's traffic.
  std::unique_ptr<Communicator> gather_communicator(int index);
  // This rank's tensor traffic over each group since the groups were made.
  const GroupTraffic& traffic() const { return traffic_; }

 private:
  layout::Topology topology_;
  int rank_;
  std::unique_ptr<ProcessGroup> world_, pipeline_, tensor_;
  std::vector<std::unique_ptr<ProcessGroup>> data_;
  std::vector<ModuleRange> data_modules_;
  struct Transport {
    Device device;
    DeviceStream producer;
    double nccl_timeout_s;
  };
  std::optional<Transport> transport_;
  GroupTraffic traffic_ = {};
  // After the MPI groups, so gone before them (a communicator may use its group's MPI communicator as it ends).
  std::map<std::vector<int>, std::unique_ptr<Communicator>> comms_;  // by members
};

// Tensor traffic over `group` for buffers of `device`: MPI for host memory, NCCL between GPUs (each operation after
// the work enqueued so far on `producer`, an NCCL wait longer than nccl_timeout_s ends the job).
std::unique_ptr<Communicator> make_communicator(const ProcessGroup& group, Device device, DeviceStream producer,
                                                double nccl_timeout_s);
// Elements per MPI call of the host communicators: Open MPI's collectives allocate temporaries as large as their
// buffer, several times over (a 24 MiB reduce-scatter bucket raised the peak memory of each of 2 ranks by 112 MiB),
// so calls are cut to bound them to a few MiB. Large reduce-scatters and all-gathers then go block by block to
// their owners (MpiCommunicator), which moves the same bytes.
constexpr size_t kMpiChunk = size_t(1) << 20;

// MPI over `group`, every MPI call limited to `max_count_per_call` elements (MPI counts are int; the tests use a
// small limit to run the splitting paths that only counts above INT_MAX take in production). With `duplicate`, on
// a copy of the group's MPI communicator (MPI_Comm_dup, collective over the group), so that its collectives may
// run on another thread at the same time as the group's own (WorldInfo::thread_multiple).
std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& group, size_t max_count_per_call,
                                                    bool duplicate = false);

}  // namespace yuan::comm
