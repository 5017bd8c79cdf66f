// The run's configuration: one struct per INI section. Decks in input/*.ini set values, `--section.key=value`
// on the command line overrides them, and layout::validate (layout/layout.h) turns every bad value into a
// one-line error naming the key. The resolved config is printed at start, saved to run.dir/config.ini, and
// hashed so ranks can check they all run the same thing.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/zero_stage.h"
#include "model/gpt.h"
#include "util/names.h"

namespace boost::program_options {
class options_description;
class variables_map;
}  // namespace boost::program_options

namespace yuan {

struct DataConfig {
  std::string train;  // glob of training shards
  std::string val;    // glob of validation shards (may be empty: no eval)
  int prefetch = 4;   // micro-batches read ahead by the loader thread
};

struct TrainConfig {
  int micro_batch = 4;    // sequences per forward/backward on one rank
  int global_batch = 8;   // sequences per optimizer step over all ranks
  int steps = 100;
  uint64_t seed = 1337;
  std::string device = "auto";  // cpu | cuda | auto
  int log_every = 1;
  int eval_every = 0;    // steps between val-loss evaluations (0: only at start and end)
  int eval_batches = 8;  // micro-batches per rank per evaluation
  int max_bad_steps = 5;  // consecutive non-finite steps before the run stops
  bool recompute = false; // recompute each block's activations in backward
};

// Where the fp32 master weights and AdamW moments live on a GPU backend (optim.offload): Host (offloaded, the OpenMP
// AdamW), None (on the device, the backend's adamw op), or Auto (the trainer takes none where its plan fits the
// device, else host: train/memory_plan.h choose_offload).
enum class Offload { Auto, Host, None };
template <>
struct Names<Offload> {
  static constexpr std::array<const char*, 3> names{"auto", "host", "none"};
};

struct OptimConfig {
  double lr = 6e-4;
  int warmup_steps = 10;
  double min_lr = 6e-5;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
  ZeroStage zero{1};       // 0 replicated, 1 optimizer state sharded, 2 gradients too, 3 working weights too
  double bucket_mb = 25;   // gradient communication bucket size
  bool delayed_update = false;  // step t's AdamW beside step t+1's forward/backward (weights one step stale)
  // Where the fp32 master weights and moments live on a GPU backend (Offload). Everything built from an
  // OptimConfig reads it through optimizer_on_device(), which takes auto as host: the trainer resolves it first.
  Offload offload = Offload::Auto;
};
inline bool optimizer_on_device(const OptimConfig& o) { return o.offload == Offload::None; }

// The job's parallel layout (src/layout/layout.h turns it into a Topology). Without pipelines the job is pure
// data parallelism: one one-stage pipeline per rank.
struct ParallelConfig {
  // "NAME: stage | stage | ...", a stage listing modules (wte, wpe, h.3) and ranges (h.0-h.3), or "NAME: auto:K"
  // for K stages balanced by modelled cost. Repeatable; a template named again on the command line replaces the
  // earlier one (in one deck it is an error).
  std::vector<std::string> templates;
  std::string pipelines;       // the job's pipelines by template name, comma-separated, repeats allowed
  std::string microbatches;    // "NAME:M, ...": micro-batches per step for each template used
  std::string schedule = "1f1b";  // 1f1b | gpipe
  int tp_size = 1;                // tensor-parallel width of every stage
};

struct DistConfig {
  double nccl_timeout_s = 600;  // an NCCL wait longer than this ends the job
  double timeout_s = 300;       // an MPI wait longer than this ends the job (comm::kDefaultTimeoutSeconds)
};

struct RunConfig {
  std::string dir = "runs/default";
};

struct InitConfig {
  std::string from;  // a HuggingFace GPT-2 directory whose weights a fresh run starts from; empty: train.seed's
};

struct ProfileConfig {
  std::string steps;    // "A:B": profile steps A..B (1-based, inclusive); empty: off
  std::string kernels;  // "A:B": the kernel account of steps A..B (backend/kernel_account.h); empty: off
  // The parsed windows; {0, -1} when off.
  std::pair<int, int> window() const;
  std::pair<int, int> kernel_window() const;
};

struct CkptConfig {
  int every = 0;                // steps between checkpoints (0: only at the end and on a signal)
  int keep = 3;                 // newest checkpoints kept
  std::string resume = "auto";  // auto: newest valid one in run.dir/ckpt | none | a checkpoint directory
  int local_every = 0;          // steps between checkpoints in node memory with a partner copy (0: off)
  std::string local_dir;        // where they go ("": /dev/shm; %h: the host name), in the job's yuanlm-<sha256> there
};

struct Config {
  GPTConfig model;
  DataConfig data;
  TrainConfig train;
  InitConfig init;
  OptimConfig optim;
  ParallelConfig parallel;
  DistConfig dist;
  RunConfig run;
  CkptConfig ckpt;
  ProfileConfig profile;

  std::string to_ini() const;  // every key, resolved, in deck format
  uint64_t hash() const;       // of to_ini()
};

// The first key (in deck order) whose values differ between two to_ini() texts, worded for an error:
// "optim.lr = '0.01' on NAME_B, '0.003' on NAME_A"; "" when they set the same values.
std::string ini_difference(const std::string& ini_a, const std::string& name_a, const std::string& ini_b,
                           const std::string& name_b);

// The checks of ranges and consistency of the keys, in deck order, in two parts; each throws Error naming the
// offending key. layout::validate (layout/layout.h) runs them with the checks that need the layers above
// (train.device, a backend's name, between the two; the [parallel] layout against the world after), so that a deck
// with several bad keys is told about the same one first wherever a check lives.
void validate_model_data_train(const Config& c);
void validate_optim_run(const Config& c);  // calls validate_dist
void validate_dist(const Config& c);        // the deadline keys alone, for commands that take no model

struct ConfigOption {
  std::string key;  // "section.key"
  std::string help;
  std::string default_value;
};
// The option table in deck order, for --help and the README.
std::vector<ConfigOption> config_options();

// Parses `args` (what follows the subcommand): an optional deck path (positional or --config), then
// --section.key=value overrides, and the command's own options when it has some (`command_options`, their values
// stored in `command_values`). Unknown keys get a did-you-mean. Returns false when --help was asked (usage
// already printed).
bool parse_config(const std::vector<std::string>& args, const std::string& command, Config& out,
                  const boost::program_options::options_description* command_options = nullptr,
                  boost::program_options::variables_map* command_values = nullptr);

// Closest known key to `key` by edit distance, or "" when none is close.
std::string closest_key(const std::string& key);

}  // namespace yuan
