// Checkpoints: run.dir/ckpt/step_NNNNNNN/ holds
//   state.json            step, the run that wrote it, loader position, Adam step count, world size, a sha256 for
//                         every file, and its own sha256 (of its canonical JSON without that member)
//   config.ini            the resolved config of the run that wrote it
//   optim_RRRRR_MMM.safetensors  fp32 master weights, exp_avg, exp_avg_sq of one optimizer shard: rank R's part of
//                         the module group starting at module M (its place in the whole model's flat buffer is in
//                         state.json), so a checkpoint holds the model whole whatever the parallel layout
//   tokenizer.*           the tokenizer the shards were made with, when known
// The master shards ARE the model: eval/sample/export concatenate them, so nothing is stored twice and every
// rank writes its own file in parallel. A checkpoint is written into a .tmp directory, fsync'd, renamed, and
// only then is ckpt/latest updated. There are no RNG streams to save: initialisation and data order are
// counter-based functions of (train.seed, loader position).
//
// Every reader (resume, eval, sample, export) checks a checkpoint before it uses it: state.json's own checksum,
// that its optimizer shards hold every value of the model exactly once, and every file's checksum.
//
// A "run" is one launch of `yuanlm train` on run.dir, numbered 1 + the highest run recorded in run.dir/runs.jsonl
// (a line per launch that started training: record_run) and among the checkpoints of both tiers, node memory's
// included. Rotation and auto-resume order checkpoints by (run, step): a run resumed from an older checkpoint, or
// started over, writes lower step numbers than the timeline it abandoned, and is still the newest, even against
// node-memory checkpoints of that timeline on nodes this launch does not have.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "model/gpt.h"
#include "optim/zero.h"

namespace yuan {

struct TrainState {
  int64_t step = 0;          // optimizer steps completed
  uint64_t next_sample = 0;  // TrainLoader::next_sample() for the next step
  int64_t run = 0;           // the launch that writes the checkpoint (ResumeChoice::run); 0: before runs were counted
};

// Collective. Returns the checkpoint's directory.
std::string save_checkpoint(const Config& cfg, const TrainState& st, ZeroOptimizers& opts,
                            const std::string& tokenizer_file);

// Collective, before this launch writes anything. What ckpt.resume asks for: a checkpoint directory, checked
// (hashing spread over the ranks) and refused with a collective Error naming the file when it does not verify;
// none, nothing, and refused when run.dir already holds checkpoints (starting over there would truncate their run's
// metrics.jsonl); auto, run.dir/ckpt's checkpoints newest first by (run, step), not yet verified: the fast tier
// (train/local_ckpt.h) may hold a newer one, and then hashing these would be for nothing.
struct ResumeChoice {
  struct Candidate {
    std::string dir;
    int64_t run = 0, step = 0;  // the run that wrote it and its step
  };
  std::string dir;  // a checkpoint directory given as ckpt.resume, verified ("" otherwise)
  int64_t run = 1;  // this launch's run number, for the checkpoints it writes, as run.dir alone sets it
  std::vector<Candidate> candidates;  // ckpt.resume=auto: run.dir/ckpt's, newest first, unverified
};
ResumeChoice choose_resume(const Config& cfg);
// Rank 0, once this launch starts training in `run_dir`: appends its record to run_dir/runs.jsonl (rewritten whole,
// atomically): {"run", "started", "host", "world", "slurm_job" (under SLURM), "step": where it starts, "from": what
// it resumed}.
void record_run(const std::string& run_dir, int64_t run, int64_t step, const std::string& from);
// Collective: "" when checkpoint `dir` verifies (each rank hashing its share of the files), else the lowest
// failing rank's reason.
std::string checkpoint_problem(const std::string& dir);

// Collective. Restores the optimizers (re-cutting the shards for whatever layout and world size this run has)
// and the backend weights from a checkpoint choose_resume picked; checks the model shape against cfg, and refuses
// data.train or data.val shards made by another tokenizer than the checkpoint's.
TrainState load_checkpoint(const std::string& dir, const Config& cfg, ZeroOptimizers& opts);
// Collective. A fresh run's start from a HuggingFace GPT-2 directory (init.from; model/hf_gpt2.h): each optimizer's
// shard of the master weights from its weights, the moments zero, and the backend's weights from them. What the
// directory's checks refuse is refused on every rank.
void load_hf_init(const std::string& dir, const Config& cfg, ZeroOptimizers& opts);

// What the node-memory tier (train/local_ckpt.h) shares with these checkpoints: the same shard files, described by
// the same "files" entries, read back and re-cut by the same code.

// The optimizer state tensors of a shard file, in the order they are written.
constexpr const char* kShardTensors[] = {"master", "exp_avg", "exp_avg_sq"};

// One optimizer shard: `count` values, the pieces of the model as tensor rank tp_rank of tp_size holds it one after
// the other (ZeroOptimizer::shard_pieces; the whole model's flat buffer at tp_size 1). A "files" entry gives one
// piece as "offset", several (ZeRO-3: one per module) as "pieces": [[offset, count], ...].
struct ShardFile {
  std::string name;
  size_t count = 0;
  std::vector<ShardPiece> pieces;
  int tp_rank = 0, tp_size = 1;
};

// The optimizers whose state a checkpoint holds: zero 0 keeps a group's whole state on every member, so only its
// rank 0's.
std::vector<ZeroOptimizer*> saved_optimizers(const ZeroOptimizers& opts);
// The file name of `opt`'s shard on world rank `rank`.
std::string shard_file_name(int rank, const ZeroOptimizer& opt);
// Writes a shard file of `count` values from the three tensors (kShardTensors order) at `path`.
void write_shard_file(const std::string& path, size_t count, const float* const tensors[3],
                      std::string* sha256 = nullptr);
// The bytes of such a file before its tensors, which follow one after another (count floats each, kShardTensors
// order): for a writer that puts the tensors in place itself.
std::string shard_file_prefix(size_t count);
// `opt`'s "files" entry for `file` (its place in the model), without the sha256.
nlohmann::ordered_json shard_entry(const ZeroOptimizer& opt, const std::string& file);
// A "files" entry with a place, read back; errors name `what` and the file.
ShardFile parse_shard_entry(const nlohmann::json& f, const std::string& what);
// Refuses shards that do not hold every value of `model` exactly once per tensor-parallel rank.
void check_coverage(const std::string& what, const std::vector<ShardFile>& shards, const GPTConfig& model);
// Where each value of file `f` belongs in the whole model's flat buffer (Run::local: its position in the file).
std::vector<ParamLayout::Run> file_runs(const GPTConfig& model, const ShardFile& f);
// Where each value of `opt`'s shard belongs in the whole model (Run::local: its position in the shard).
std::vector<ParamLayout::Run> wanted_runs(const GPTConfig& model, const ZeroOptimizer& opt);
// Calls copy(from, to, n) for every stretch that a file's runs `have` and a shard's runs `want` share: n values
// from position `from` of the file to position `to` of the shard.
void for_overlaps(const std::vector<ParamLayout::Run>& have, const std::vector<ParamLayout::Run>& want,
                  const std::function<void(size_t from, size_t to, size_t n)>& copy);
// What a sealed JSON file's own "sha256" (state.json's, a local manifest's) is the checksum of: its JSON without that
// member, keys sorted, no whitespace (nlohmann::json's dump()), so that re-indenting the file keeps it valid and
// changing any value does not.
std::string json_checksum(nlohmann::json t);
// The model's dimensions as checkpoints compare them.
bool same_model(const GPTConfig& a, const GPTConfig& b);

// One process, no MPI: a checkpoint as eval, sample and export read it. `path` is a checkpoint directory or a run
// directory (its newest checkpoint, via ckpt/latest). read_checkpoint_info reads only the small files: state.json,
// checked against its own sha256, and config.ini and the tokenizer, checked against state.json's checksums for them.
// A command checks its options against that before load_checkpoint_model reads the shards (tens of GB for a large
// model: optimizer moments too) to verify every file, hashing on the process's threads, and load the weights.
struct CheckpointInfo {
  std::string dir;
  Config cfg;
  int64_t step = 0;
  int world = 1;               // ranks of the run that wrote it
  std::string tokenizer;       // path of the tokenizer file in the checkpoint, "" when the run had none
  std::string tokenizer_sha256;
  std::vector<ShardFile> shards;                               // as state.json places them
  std::vector<std::pair<std::string, std::string>> checksums;  // every file state.json lists, with its sha256
};
CheckpointInfo read_checkpoint_info(const std::string& path);

struct CheckpointModel : CheckpointInfo {
  std::vector<float> weights;  // layout order, ParamLayout(cfg.model).total() values
};
CheckpointModel load_checkpoint_model(CheckpointInfo info);
CheckpointModel load_checkpoint_model(const std::string& path);  // of read_checkpoint_info(path)

// Refuses the shards of `glob` when they were made by another tokenizer than the checkpoint's (the shards'
// "tokenizer" attribute names it with its sha256). Shards or checkpoints that do not say are accepted.
void check_tokenizer(const CheckpointInfo& c, const std::string& glob);

}  // namespace yuan
