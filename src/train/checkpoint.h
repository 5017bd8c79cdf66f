// Checkpoints: run.dir/ckpt/step_NNNNNNN/ holds
//   state.json            step, loader position, Adam step count, world size, and a sha256 for every file
//   config.ini            the resolved config of the run that wrote it
//   optim_RRRRR_MMM.safetensors  fp32 master weights, exp_avg, exp_avg_sq of one optimizer shard: rank R's part of
//                         the module group starting at module M (its place in the whole model's flat buffer is in
//                         state.json), so a checkpoint holds the model whole whatever the parallel layout
//   tokenizer.*           the tokenizer the shards were made with, when known
// The master shards ARE the model: eval/sample/export concatenate them, so nothing is stored twice and every
// rank writes its own file in parallel. A checkpoint is written into a .tmp directory, fsync'd, renamed, and
// only then is ckpt/latest updated. There are no RNG streams to save: initialisation and data order are
// counter-based functions of (train.seed, loader position).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "optim/zero.h"

namespace yuan {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  uint64_t next_sample = 0;  // TrainLoader::next_sample() for the next step
};

// Collective. Returns the checkpoint's directory.
std::string save_checkpoint(const Config& cfg, const TrainState& st, ZeroOptimizers& opts,
                            const std::string& tokenizer_file);

// Collective. The newest checkpoint under run.dir/ckpt whose files all match their checksums ("" if none);
// each one that does not is reported by name and skipped.
std::string find_resumable_checkpoint(const std::string& run_dir);

// Collective. Restores the optimizers (re-cutting the shards for whatever layout and world size this run has)
// and the backend weights; checks the model shape against cfg.
TrainState load_checkpoint(const std::string& dir, const Config& cfg, ZeroOptimizers& opts);

// One process, no MPI: the model of a checkpoint for eval, sample and export. `path` is a checkpoint
// directory or a run directory (its newest checkpoint, via ckpt/latest).
struct CheckpointModel {
  std::string dir;
  Config cfg;
  int64_t step = 0;
  int world = 1;               // ranks of the run that wrote it
  std::vector<float> weights;  // layout order, ParamLayout(cfg.model).total() values
  std::string tokenizer;       // path of the tokenizer file in the checkpoint, "" when the run had none
};
CheckpointModel load_checkpoint_model(const std::string& path);

// The tokenizer file behind a training glob: manifest.json beside the first shard names it ("" when there is
// no manifest, e.g. shards written by another tool).
std::string find_tokenizer_for(const std::string& train_glob);

}  // namespace yuan
