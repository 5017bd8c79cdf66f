// The fast checkpoint tier's storage (the tier: train/local_ckpt.h): where a job's copies live in node memory, the
// mapped files they are written through, the two generations whose files are reused in place, the manifests that
// seal them (CRC-32C of every file) and the listing and verification of what a node holds. Files and memory only:
// no MPI, so that it is tested on its own (tests/test_local_store.cpp). The layout of a job's directory on a node:
//   step_NNNNNNN/rank_RRRRR/            rank R's own copy: manifest.json + its optim_*.safetensors
//   partner/step_NNNNNNN/rank_RRRRR/    the copy this node keeps for rank R of another node
// Each copy is written into a .tmp_ directory beside the final one and renamed once its manifest is in it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "layout/nodes.h"
#include "optim/zero.h"

namespace yuan {

// The job's directory in ckpt.local_dir for a rank on host `host`: <ckpt.local_dir>/yuanlm-<16 hex digits of the
// sha256 of the absolute run.dir>, the same for every relaunch of a job and another for every job, so that jobs given
// one ckpt.local_dir (a site default, a copied deck) never see, replace or remove each other's checkpoints; "" is
// /dev/shm; "%h" expands to `host`.
std::string resolve_local_dir(const Config& cfg, const std::string& host);
// run.dir, absolute: a manifest names it so that no other job resumes from it.
std::string absolute_run_dir(const Config& cfg);
std::string step_dir_name(int64_t step);  // step_NNNNNNN
std::string rank_dir_name(int rank);      // rank_RRRRR

// The rank that keeps `rank`'s partner copy: the same local rank (modulo the node's ranks) on the next node; -1 on
// one node.
int partner_rank(const layout::NodeMap& nodes, int rank);

// The bytes of node-local storage the tier takes on a node: two generations of its ranks' own shards (`own`, by
// world rank) and of those it keeps as partner.
size_t local_storage_needed(const layout::NodeMap& nodes, const std::vector<size_t>& own, int node);
// The bytes a rank's own copy of `opts` takes (its shard files; the headers are small).
size_t own_copy_bytes(const ZeroOptimizers& opts);
// Why `dir` cannot hold the `need` bytes of local checkpoints of node `node` (a label): not writable (it is made if
// missing, and a file written and removed as rank `rank`'s probe), or too little free space; "" when it can.
std::string local_dir_problem(const std::string& dir, int rank, size_t need, const std::string& node);

// A shard file of a copy, mapped: of the own copy, whose tensors the training thread copies into it (checksummed on
// the way) and which is sent to the partner from it; or of a partner's copy, received into it. It stays mapped from
// one generation to the one after the next, which overwrites it in place, so the copy costs no page faults: on the
// 2-core VM (2026-11-27) 750 MB cost 0.10 s of CPU into a file mapped before, 0.6 s into a new mapping of the same
// tmpfs pages and 1.5 s into new pages.
struct MappedShard {
  // A new file of `count` values per tensor at `path`, its shard_file_prefix written, its space reserved.
  MappedShard(const std::string& path, size_t count);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const std::string name;  // in its directory
  const size_t count;       // values per tensor
  const size_t bytes;
  void* base;
  float* tensors = nullptr;  // master, exp_avg, exp_avg_sq, one after another

 private:
  MappedShard(const std::string& path, size_t count, const std::string& prefix);
};

// One copy's files, kept mapped.
struct LocalSlot {
  std::string dir;  // where its files are: its .tmp_ directory while written, then the generation's
  std::vector<std::unique_ptr<MappedShard>> files;  // by saved optimizer
  // New files for `shards` (name, values per tensor) in the emptied directory `at`, which becomes dir.
  void create(const std::string& at, const std::vector<std::pair<std::string, size_t>>& shards);
  // Its directory renamed to `at` (emptied first), its files still mapped: a later generation's .tmp_ directory.
  void move_to(const std::string& at);
  // Its files synced, its manifest written and its directory renamed to `final_dir` (a copy of the same step from
  // an abandoned timeline is superseded).
  void seal(const std::string& final_dir, const std::string& manifest);
};

// The copies a rank writes in the job's directory `dir` of its node: its own and those of `senders` (the ranks it
// is partner of), of the last two generations, each generation in the slots of the one before the previous.
class LocalStore {
 public:
  LocalStore(std::string dir, int rank, std::vector<int> senders);
  const std::string& dir() const { return dir_; }

  // Before generation `step` is written: its own copy's .tmp_ directory, holding the files of the generation before
  // the previous when `reuse` (the previous one is complete everywhere, so that one is being dropped) and new files
  // for `shards` (name, values per tensor) otherwise, as that one may be the last complete generation. With
  // `reuse_partners` the partner copies of that generation are renamed into this one's .tmp_ directories too, so
  // that the exchange receives straight into their pages; else they are let go (their files stay until a later
  // generation drops them). Throws, with this generation's slots let go, when a directory cannot be made.
  void prepare(int64_t step, bool reuse, bool reuse_partners, const std::vector<std::pair<std::string, size_t>>& shards);
  // The one pass over the optimizer state a checkpoint makes: each tensor of `saved` copied into the prepared files
  // and checksummed while it is in registers; the CRC-32C of each file, by saved optimizer.
  std::vector<uint32_t> copy_in(const std::vector<ZeroOptimizer*>& saved);
  // The own copy prepared last.
  const LocalSlot& own() const { return slots_[last_]; }
  void seal_own(int64_t step, const std::string& manifest);
  // The files that the partner copy of senders[i] of generation `step` (described by its `manifest`) is received
  // into: those prepare renamed into place when they fit it, else new ones.
  LocalSlot& partner_files(size_t i, int64_t step, const nlohmann::json& manifest);
  void seal_partner(size_t i, int64_t step, const std::string& manifest);
  // On a node's first rank: removes every generation but `keep` (complete everywhere) and `next` (being written).
  void drop_older(const std::string& keep, const std::string& next) const;
  // Every file let go (their pages go with them): the run finished.
  void release();

 private:
  std::string partner_dir(int64_t step) const { return dir_ + "/partner/" + step_dir_name(step); }

  std::string dir_;
  int rank_ = 0;
  std::vector<int> senders_;
  LocalSlot slots_[2];
  // The partner copies, by sender, of the same two generations (the same index): received straight into mapped
  // files, with no buffer besides (writing 750 MB into fresh tmpfs pages took 1.5 s of CPU on the 2-core VM,
  // 2026-11-27).
  std::vector<LocalSlot> partner_slots_[2];
  int last_ = 1;  // the slot prepared last
};

// The sealed text of a copy's manifest: the format, then `fields` (step, run, loader position, Adam step, world,
// each file's place and CRC-32C, ...), then the sha256 of all that.
std::string local_manifest(const nlohmann::ordered_json& fields);

// The copies the job's directory `dir` of a node holds, listed by its first rank `holder`, each as {"holder", "own",
// "path", "manifest"}, or {"path", "problem"} when its manifest does not check (unsealed, changed, another model's);
// copies of another job sharing the directory are left out.
nlohmann::json list_local_copies(const Config& cfg, const std::string& dir, int holder);
// Why the copy at `path` does not verify against its `manifest` (a file missing or not matching its CRC-32C); ""
// when it does.
std::string local_copy_problem(const std::string& path, const nlohmann::json& manifest);

}  // namespace yuan
