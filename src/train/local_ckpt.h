// The fast checkpoint tier: every ckpt.local_every steps each rank snapshots its optimizer shards and a thread of
// its own writes them to node-local memory (ckpt.local_dir, /dev/shm by default) and sends a copy to a partner rank
// on the next node, which keeps it in its own node's directory, so that one lost node never takes both copies
// (LLNL SCR's partner scheme; GEMINI's CPU-memory checkpoints). The shard files are those of run.dir/ckpt
// (train/checkpoint.h); a copy's manifest.json holds what state.json holds for them (step, run, loader position,
// Adam step, world, each file's place) and its own sha256, with a CRC-32C for each file where state.json has a
// sha256: the tier rewrites the whole optimizer state every few steps, and the CRC costs a tenth as much CPU while
// still catching a corrupted or truncated file. A rank's own copy reuses, in place, the files of the generation it
// replaces. A generation is deleted once a newer one is complete on every rank (agreed at the next local
// checkpoint); a run that finishes all its steps removes them all.
//
// Resume (ckpt.resume=auto) looks at every node's directory: the newest (run, step) whose every old rank's shard is
// held by some node, checksums verified, wins over run.dir/ckpt's newest when it is newer; its holders send each new
// rank the slices of the model its new shards need, re-cut for any world size like load_checkpoint.
//
// This file drives the tier through the job's agreements (comm/world.h); its three parts are the storage
// (train/local_store.h: the directory's layout, mapped files, generations, manifests), the transport
// (train/local_exchange.h: every MPI call of the tier) and the choice of what to resume from
// (train/local_choice.h).
//
// Test hook: YUANLM_KILL_AFTER_SEAL=STEP SIGKILLs rank 0 once its own copy of that step is sealed
// (tests/mpi/test_local_ckpt_runs.sh).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/config.h"
#include "optim/zero.h"
#include "train/checkpoint.h"
#include "train/local_exchange.h"
#include "train/local_store.h"

namespace yuan {

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
  nlohmann::ordered_json manifest_fields(const TrainState& st, const ZeroOptimizers& opts,
                                         const std::vector<uint32_t>& crcs) const;

  std::string run_dir_;  // absolute: a manifest names it so that no other job resumes from it
  size_t n_params_ = 0;
  std::vector<int> partners_;       // by world rank: partner_rank (the manifest keeps them, to say where copies were)
  std::vector<std::string> files_;  // the own copy's file names, by saved optimizer
  LocalStore store_;
  PartnerExchange exchange_;
  std::thread writer_;
  bool ok_ = true;                // the last write completed
  int64_t kill_after_seal_ = -1;  // YUANLM_KILL_AFTER_SEAL, on rank 0
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
