// The fast checkpoint tier: every ckpt.local_every steps each rank snapshots its optimizer shards and a thread of
// its own writes them to node-local memory (ckpt.local_dir, /dev/shm by default) and sends a copy to a partner rank
// on the next node, which keeps it in its own node's directory, so that one lost node never takes both copies
// (LLNL SCR's partner scheme; GEMINI's CPU-memory checkpoints). The layout of the job's directory on a node
// (resolve_local_dir):
//   step_NNNNNNN/rank_RRRRR/            rank R's own copy: manifest.json + its optim_*.safetensors
//   partner/step_NNNNNNN/rank_RRRRR/    the copy this node keeps for rank R of another node
// The shard files are those of run.dir/ckpt (train/checkpoint.h); manifest.json holds what state.json holds for
// them (step, run, loader position, Adam step, world, each file's place) and its own sha256, with a CRC-32C for
// each file where state.json has a sha256: the tier rewrites the whole optimizer state every few steps, and the
// CRC costs a tenth as much CPU while still catching a corrupted or truncated file. Each copy is written into a
// .tmp_ directory and renamed; a rank's own copy reuses, in place, the files of the generation it replaces. A
// generation is deleted once a newer one is complete on every rank (agreed at the next local checkpoint); a run that
// finishes all its steps removes them all.
//
// Resume (ckpt.resume=auto) looks at every node's directory: the newest (run, step) whose every old rank's shard is
// held by some node, checksums verified, wins over run.dir/ckpt's newest when it is newer; its holders send each new
// rank the slices of the model its new shards need, re-cut for any world size like load_checkpoint.
//
// Test hooks: YUANLM_PARTNER_SILENT=RANK makes that rank take no part in the partner exchanges, like a rank whose
// node stopped answering, so that the ranks it exchanges with time out (tests/cluster/test_local_ckpt_partner.sh);
// YUANLM_KILL_AFTER_SEAL=STEP SIGKILLs rank 0 once its own copy of that step is sealed
// (tests/mpi/test_local_ckpt_runs.sh).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "optim/zero.h"
#include "parallel/mpi_check.h"
#include "parallel/nodes.h"
#include "train/checkpoint.h"

namespace yuan {

// The job's directory in ckpt.local_dir for a rank on host `host`: <ckpt.local_dir>/yuanlm-<16 hex digits of the
// sha256 of the absolute run.dir>, the same for every relaunch of a job and another for every job, so that jobs given
// one ckpt.local_dir (a site default, a copied deck) never see, replace or remove each other's checkpoints; "" is
// /dev/shm; "%h" expands to `host`.
std::string resolve_local_dir(const Config& cfg, const std::string& host);

// The rank that keeps `rank`'s partner copy: the same local rank (modulo the node's ranks) on the next node; -1 on
// one node.
int partner_rank(const parallel::NodeMap& nodes, int rank);

// The bytes of node-local storage the tier takes on a node: two generations of its ranks' own shards (`own`, by
// world rank) and of those it keeps as partner.
size_t local_storage_needed(const parallel::NodeMap& nodes, const std::vector<size_t>& own, int node);

class LocalTier {
 public:
  // Collective, with ckpt.local_every > 0: resolves the directory, refuses (collectively) one that is not writable
  // or has less free space than local_storage_needed, and says where the checkpoints go.
  LocalTier(const Config& cfg, const ZeroOptimizers& opts);
  ~LocalTier();  // waits for the write in flight
  LocalTier(const LocalTier&) = delete;
  LocalTier& operator=(const LocalTier&) = delete;

  // Collective, after `st.step` steps, with no update in flight: waits for the previous write if it is still going,
  // drops older generations once it is complete everywhere and snapshots the shards into their files.
  void save(const TrainState& st, const ZeroOptimizers& opts);
  // After save, once the step's record is in run.dir/metrics.jsonl: starts sealing the snapshot (the manifest and
  // the rename, then the partner exchange), so that no checkpoint is ever resumed from whose step has no record.
  void seal();
  // When the run finished all its steps: waits for the write in flight and lets go of the files, before
  // remove_local_checkpoints.
  void finish();

 private:
  void write(int64_t step, const std::string& manifest);  // on the writer thread: seals the own copy, then the
                                                           // partner exchange
  bool exchange(int64_t step, const std::string& manifest);
  void take_partner_files(const std::string& name, bool drop);
  void drop_older(const std::string& keep, const std::string& next) const;

  std::string dir_, run_dir_;  // run_dir_: absolute; a manifest names it so that no other job resumes from it
  size_t n_params_ = 0;
  int rank_ = 0, partner_ = -1;
  std::vector<int> partners_;  // by world rank: partner_rank (the manifest keeps them, to say where copies were)
  std::vector<int> senders_;  // the ranks whose partner copies this rank keeps
  std::string partner_label_;
  double timeout_s_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the exchange's own, so that it never meets the training's messages
  std::vector<std::string> files_;  // the own copy's file names, by saved optimizer
  struct MappedShard;
  // The own copy's files of the last two generations, kept mapped: a generation takes over the files of the one
  // before the previous when that is dropped, so that the copy into them finds their pages in place.
  struct Slot {
    std::string dir;  // where its files are: this rank's .tmp_ directory while written, then the generation's
    std::vector<std::unique_ptr<MappedShard>> files;  // by saved optimizer
    // New files for `shards` (name, values per tensor) in the emptied directory `at`, which becomes dir.
    void create(const std::string& at, const std::vector<std::pair<std::string, size_t>>& shards);
    // Its directory renamed to `at` (emptied first), its files still mapped: a later generation's .tmp_ directory.
    void move_to(const std::string& at);
    void sync() const;  // msync of every file (for the manifest that follows)
  };
  Slot slots_[2];
  int last_ = 1;  // the slot written last
  // The partner copies this rank keeps, by sender, of the same two generations (the same index): received straight
  // into mapped files that a generation takes over from the one before the previous, as the own copy's, with no
  // buffer besides (writing 750 MB into fresh tmpfs pages took 1.5 s of CPU on the 2-core VM, 2026-11-27).
  std::vector<Slot> partner_slots_[2];
  std::thread writer_;
  bool ok_ = true;                // the last write completed, both copies
  bool silent_ = false;           // YUANLM_PARTNER_SILENT names this rank
  int64_t kill_after_seal_ = -1;  // YUANLM_KILL_AFTER_SEAL, on rank 0
  bool exchanging_ = true;        // false after a partner did not answer in time: own copies only from then on
  std::string previous_;          // the directory name of the generation written last ("" before the first)
  std::optional<std::pair<int64_t, std::string>> pending_;  // a snapshot's step and manifest, saved, not yet sealed
};

// Collective, before this launch writes anything, in place of load_checkpoint: with ckpt.resume=auto the newest that
// verifies of the local tier's complete checkpoints and `fs`'s candidates (choose_resume's; a filesystem checkpoint
// is hashed only when no local one is newer), else `fs.dir`, loaded; says which tier, which step and how many steps
// were lost against run.dir/metrics.jsonl. A newer local checkpoint that lacks a shard is named with the nodes its
// copies were on, and skipped; a checkpoint that does not verify is named and skipped. With ckpt.resume=none, node
// memory holding checkpoints of this run.dir is refused (a collective Error), as choose_resume refuses run.dir/ckpt's.
// Sets `run` to this launch's run number (above every run of both tiers) and `from` to what it resumed ("": nothing).
TrainState resume_best_tier(const Config& cfg, const ResumeChoice& fs, ZeroOptimizers& opts, int64_t* run,
                            std::string* from);

// Collective, when a run finished all its steps (run.dir/ckpt holds the last): each node's first rank removes the
// job's directory in node memory, whether or not this launch wrote local checkpoints (older launches' may be there).
void remove_local_checkpoints(const Config& cfg);

}  // namespace yuan
