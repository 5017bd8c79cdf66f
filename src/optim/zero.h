// ZeRO data-parallel AdamW with the optimizer offloaded to the host (ZeRO-Offload). The fp32 master weights and
// the AdamW moments live in host memory, sharded over the data-parallel ranks; the backend keeps the working
// weights and gradients (see backend/backend.h).
//
//   zero 0: gradients all-reduced, every rank holds and updates the whole optimizer state.
//   zero 1: gradients reduce-scattered once per step; rank r holds and updates shard r of the master weights
//           and moments (1/N of the bytes), then the weights are all-gathered.
//   zero 2: as 1, but each finished bucket is reduce-scattered during backward of every micro-batch and
//           accumulated into the host gradient shard, so no rank keeps a full gradient across micro-batches.
//   zero 3: as 2, and the working weights are sharded too: the backend holds 1/N of every module, and the
//           optimizer, as the program's ParamSource, all-gathers a module where forward or backward uses it and
//           reduce-scatters its gradient as soon as backward reports it ready (below).
//
// One optimizer covers a range of whole modules of the backend's flat buffer (a module group of the topology:
// every module of the model for plain data parallelism) over one data-parallel group, the Communicator it is
// given: the ranks that hold those modules. Of the range's n parameters, group rank r owns the shard
// [r*S, min((r+1)*S, n)), S = ceil(n/N) (the last shards may be shorter, or empty); at zero 3 each module is cut
// that way on its own, so that a module gathers from N blocks. Communication goes bucket by bucket
// (optim.bucket_mb, whole modules in reverse layout order, the order backward finishes them; zero 3: one module).
// Clipping uses the exact global norm: reduce_gradients() gives this rank's share of its square, end_step() (below)
// sums the shares of all optimizers over the world and passes the norm to step().
//
// The pipeline, per bucket: reduce (Communicator, on its stream for NCCL) -> this rank's part copied into a
// host gradient buffer (Backend::to_host_async into transfer memory, on a copy stream) -> after backward: the
// global norm, then OpenMP AdamW over the shard tile by tile (a tile is a bucket's part of the shard), each
// finished tile's working weights uploaded on alternating copy lanes while the next tile updates -> all-gather
// (zero 1 and 2; zero 3 gathers where the weights are next used). At zero 2 and 3 the buckets go during every
// backward; at zero 0 and 1 during the step's last backward when the caller announces it
// (before_last_micro_batch), else in reduce_gradients(). On host backends every transfer is a copy.
//
// ZeRO-3's gathered modules: wte, wpe and ln_f, used at both ends of every micro-batch, each have their own buffer
// and stay gathered from their first use in a step until the weights change; the blocks share two buffers, so the
// next block (forward: the following one, backward: the preceding one) is gathered while the current one computes
// (on the communicator's stream; with host communicators on a thread of its own, parallel/comm_thread.h), and the
// two blocks that end a forward are still there when backward starts. Gradients have the same buffers,
// each zeroed when a module's backward takes it and free once its reduction has left. Per micro-batch that
// moves every parameter three times (gathered for forward and for backward, reduce-scattered) against twice per
// step at zero 1 and 2 (reduce-scatter, all-gather), for device memory of 1/N of the weights plus those buffers.
// Every member of the group must run the same passes in the same order (one stage per pipeline).
//
// optim.delayed_update: step t's AdamW runs on a host thread while step t+1's forward and backward run, and its
// weights reach the backend at the start of step t+2's. That is a different algorithm: the gradient of step t is
// taken at the weights of step t-2 (those of step 0 for t <= 1), w_t = AdamW(w_{t-1}, grad L(w_{t-2}; batch_t)).
#pragma once
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "ops/adamw.h"
#include "parallel/comm_thread.h"
#include "parallel/communicator.h"
#include "program/program.h"
#include "util/memory.h"

namespace yuan {

// Group rank `rank`'s shard of n parameters over `ranks` at ZeRO stage `stage` (everything at stage 0): offset
// and count inside the range.
struct Shard {
  size_t offset = 0, count = 0;
};
Shard zero_shard(size_t n_params, int ranks, int rank, int stage);
// Elements of rank `rank`'s shard of `modules` of `layout` (empty: all of them) at `stage`: at zero 3 the sum of
// its block of each module, which is also the size of the backend's flat weights (program/params.h backend_spec).
size_t zero_shard_elements(const ParamLayout& layout, ModuleRange modules, int ranks, int rank, int stage);
// Host bytes of optimizer state of a shard of `shard` elements: fp32 master weights, both moments and the fp32
// gradient (two with delayed_update). Exactly what a ZeroOptimizer allocates as Mem::Optimizer; its transfer
// staging is Mem::Comm. Rank 0's shard is the largest.
size_t zero_optimizer_bytes(size_t shard, bool delayed_update = false);
// The buckets a ZeroOptimizer reduces gradients in: whole modules of `modules` (empty: all of the layout's), about
// o.bucket_mb MiB of fp32 each, last module first (the order backward finishes them); one module each at zero 3.
std::vector<ModuleRange> zero_buckets(const ParamLayout& layout, ModuleRange modules, const OptimConfig& o);
// Host memory of a rank's optimizer over a shard of `shard` elements: the optimizer state (zero_optimizer_bytes,
// Mem::Optimizer) and the transfer staging (Mem::Comm): at zero 2 and 3 with `overlap` a second gradient shard that
// later micro-batches' reductions land in; with bf16 working weights the updated weights on their way to the
// device, the whole shard with delayed_update, else two tiles of at most `largest_tile` elements.
struct ZeroHostMemory {
  size_t optimizer = 0, staging = 0;
};
ZeroHostMemory zero_host_memory(const OptimConfig& o, size_t shard, size_t largest_tile, bool overlap,
                                DType weights);
// ZeRO-3's module buffers (above) for `modules` of `layout`, in elements: as many working weights as gradients.
size_t zero3_buffer_elements(const ParamLayout& layout, ModuleRange modules);
// The device memory of a backend for `layout` (program/program.h ParamMemory): whole, or with `shards` (ZeRO-3's
// shard elements, as backend_spec takes them) those and the module buffers.
ParamMemory zero_param_memory(const ParamLayout& layout, std::optional<size_t> shards);

// The AdamW settings of `o` for step t (from 1) at learning rate lr, with the gradient scaled down to
// o.grad_clip when the global norm exceeds it (torch.nn.utils.clip_grad_norm_). Weight decay is o's: callers
// turn it off where it does not apply (model/gpt.h decay_segments).
ops::AdamWHyper adamw_hyper(const OptimConfig& o, double lr, int64_t t, double grad_norm);

struct ZeroStepStats {
  double grad_norm = 0;           // global L2 norm before clipping, as passed to step()
  double comm_seconds = 0;        // host time in and waiting for collectives and gradient copies since last step
  double optim_seconds = 0;       // host time of the update on the critical path: norm, AdamW, weight upload
                                  // (delayed_update: norm, waiting for the previous update, its upload)
  double background_seconds = 0;  // delayed_update: the AdamW that ran on the worker thread beside compute
  bool skipped = false;           // no update: the norm was not finite, or the caller asked to skip
};

// Where an optimizer takes the initial values of its shard from: a function writing the backend layout's range
// [offset, offset + count) to dst (init_gpt2 on that range, so that no rank holds the whole model at once), or an
// array of the whole layout.
class ParamInit {
 public:
  using Fill = std::function<void(size_t offset, size_t count, float* dst)>;
  explicit ParamInit(Fill fill) : fill_(std::move(fill)) {}
  ParamInit(const float* whole)  // NOLINT(google-explicit-constructor): an array is the common case in tests
      : fill_([whole](size_t offset, size_t count, float* dst) { std::copy_n(whole + offset, count, dst); }) {}
  void operator()(size_t offset, size_t count, float* dst) const { fill_(offset, count, dst); }

 private:
  Fill fill_;
};

// The part of a shard that lies in one run of the model as this tensor rank holds it (every module, each tensor
// this rank's part; the whole model without tensor parallelism): checkpoints place shards by these.
struct ShardPiece {
  size_t model_offset = 0, count = 0;
};

class ZeroOptimizer : public ParamSource {
 public:
  // `layout`: the parameters of the backend's flat buffers (program/params.h backend_spec; at zero 3 the backend
  // holds this rank's shards of them). `modules`: whole modules of the layout, contiguous in it and in the model
  // (empty: all of the layout's). `init`: the initial fp32 parameters of the layout (identical on every member of
  // the group). Keeps this rank's shard as the master copy and loads the backend's working weights.
  // `overlap`: reduce each bucket as backward completes it (zero 2: in every micro-batch). Off, every reduction
  // waits for reduce_gradients() and zero 2 communicates as zero 1 does: for groups whose members run different
  // numbers of micro-batches, or wait on each other through pipeline stages. Zero 3 needs it, and a backend made
  // with backend_spec(layout, zero_shard_elements(...)); the program then takes this optimizer as its ParamSource.
  // `gathers`: zero 3 with a host communicator, a duplicate of `comm` (parallel/groups.h) on which the gathers run
  // on a thread of their own beside compute; without it they run in the calling thread.
  ZeroOptimizer(const OptimConfig& cfg, Backend& backend, const ParamLayout& layout, Communicator& comm,
                const ParamInit& init, ModuleRange modules = {}, bool overlap = true,
                std::unique_ptr<Communicator> gathers = nullptr);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;  // the ready hook captures `this`
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Pass as the program's `ready` hook (program/program.h).
  const ModuleReadyFn& ready_hook() const { return ready_; }
  // Optional, before the step's last micro-batch: zero 0 and 1 then reduce and copy out each bucket as backward
  // finishes it, instead of all of them in reduce_gradients().
  void before_last_micro_batch();
  // After every micro-batch's backward.
  void after_micro_batch();
  // After the step's last micro-batch: finish reducing the gradients into this rank's host shard and zero the
  // backend's; returns this rank's share of the squared global gradient norm (the shares of the world's ranks
  // sum to it).
  double reduce_gradients();
  // Clip to optim.grad_clip against `grad_norm`, AdamW with learning rate `lr` on this rank's shard, put the new
  // weights into the backend (all-gathered for zero >= 1). With `skip` (a non-finite loss) or a non-finite norm,
  // the gradients are dropped and weights and moments stay as they were. With delayed_update the update is
  // started here and lands in the backend at the next step() or drain().
  ZeroStepStats step(double lr, double grad_norm, bool skip = false);
  // Completes a delayed update still in flight and loads it into the backend. Collective: every rank calls it,
  // before reading the state below (checkpoints), evaluating, or at the end.
  void drain();

  // ParamSource, at zero 3 (collective: the members of the group acquire the same modules in the same order).
  void acquire(int module, bool grads) override;
  void release(int module) override;
  Tensor weight(const TensorSpec& t) const override;
  Tensor grad(const TensorSpec& t) const override;

  int stage() const;
  int group_rank() const;
  const TensorParallel& tensor_parallel() const { return layout_.tp(); }
  const ModuleRange& modules() const { return modules_; }
  size_t shard_offset() const;  // in the backend's flat buffer
  size_t shard_size() const;
  // Where the shard's values (in master() order) belong in the model; one piece below zero 3, one per module at it.
  std::vector<ShardPiece> shard_pieces() const;
  // Optimizer state of this rank's shard (shard_size() values each), for checkpoints; not while an update is in
  // flight (drain() first).
  float* master();
  float* exp_avg();
  float* exp_avg_sq();
  int64_t adam_step() const;
  void set_adam_step(int64_t s);
  // After master() was overwritten (checkpoint restore): push it into the backend's working weights.
  void load_backend_params();

 private:
  struct Bucket {
    size_t offset = 0, count = 0;  // range of the backend's flat buffer
    int first_module = 0, last_module = 0;
    int pending = 0;               // modules not yet finished in the current micro-batch
    bool reduced = false;          // reduced and on its way to the host in the current micro-batch / step
  };
  struct Tile {
    size_t offset = 0, count = 0;      // a bucket's part of this rank's shard
    size_t backend = 0;                // where it is in the backend's flat weights
    std::vector<DecaySegment> pieces;  // the tile split where weight decay changes, offsets in the shard
  };
  // A run of this rank's shard: `count` elements from `layout` in the backend's layout, at `host` in the shard.
  struct Piece {
    size_t layout = 0, host = 0, count = 0;
  };
  // ZeRO-3: a buffer for one module's gathered weights or its gradient at a time.
  struct ModuleBuffer {
    Allocation mem;
    int module = -1;           // whose values it holds (-1: none)
    int pins = 0;              // weights: acquired and not yet released
    uint64_t last_use = 0;     // weights: when last acquired, for the choice between the blocks' two buffers
    uint64_t ticket = 0;       // weights: its gather on the communication thread, until waited for
  };
  void module_ready(int module);
  void reduce_bucket(Bucket& b);            // reduce b; start copying this rank's part into the host gradient
  void finish_reductions(bool accumulate);  // wait for them; zero the backend's gradients
  std::vector<size_t> shard_counts(const Bucket& b) const;  // b's intersection with each rank's shard
  size_t rank_offset(int r) const;  // start of group rank r's shard in the backend's buffer
  // AdamW over tile `t` from gradient `g` (the shard's); its working weights in bf16 into `bf16` when not null.
  void update_tile(const Tile& t, const float* g, uint16_t* bf16, const ops::AdamWHyper& h);
  void update_and_upload(const float* g, const ops::AdamWHyper& h);  // the pipelined update, in place
  void upload_shard();  // the working weights of the whole shard from master (or its bf16 copy)
  void gather_params();
  void join_worker();   // the delayed update finished, its weights uploaded and gathered
  void check_no_update_in_flight(const char* what) const;
  // ZeRO-3
  void check_zero3(const char* what) const;
  std::vector<size_t> module_counts(int module) const;  // each rank's block of the module
  int buffer_for(std::vector<ModuleBuffer>& pool, int module, bool weights) const;  // a free buffer that fits
  static int held(const std::vector<ModuleBuffer>& pool, int module);  // the buffer holding module, or -1
  void gather(int module);          // into a buffer, unless it is there already
  void wait_gather(ModuleBuffer& b);  // its gather on the communication thread is done
  void reduce_module(int module);   // the module's gradient buffer: reduce-scatter, copy out, free
  void flush_reductions();          // issue the reductions of the modules reported ready

  OptimConfig cfg_;
  Backend& backend_;
  const ParamLayout layout_;  // of the backend's flat buffers
  Communicator& comm_;
  ModuleReadyFn ready_;
  std::vector<Bucket> buckets_;
  ModuleRange modules_;
  std::vector<int> bucket_of_module_;  // by module index; -1 outside the range
  std::vector<bool> module_done_;      // by module index: reported ready in the current micro-batch
  std::vector<Tile> tiles_;
  size_t range_off_ = 0, range_n_ = 0;      // the modules' part of the backend's layout
  size_t shard_off_ = 0, shard_n_ = 0;      // this rank's shard, in the backend's flat buffer
  size_t stride_ = 0;                        // S: shard r starts at range_off_ + r * S (below zero 3)
  size_t global_off_ = 0;                   // where the range starts in the model's buffer (shard_pieces)
  std::vector<Piece> pieces_;               // the shard in the layout: one piece, or one per module at zero 3
  bool bf16_ = false;  // the backend's working weights are bf16: AdamW writes them for upload
  HostArray<float> master_, m_, v_;
  Allocation grad_[2];     // fp32 gradient of the shard (full for zero 0); the second for delayed_update
  Allocation incoming_;    // zero 2: a later micro-batch's reduced shard, added into grad_
  Allocation stage_[2];    // bf16 tiles on their way to the backend, one per copy lane
  Allocation bf16_shard_;  // delayed_update with bf16 weights: the updated shard waiting for its upload
  int cur_ = 0;             // grad_ that backward fills; the other one is being updated (delayed_update)
  int micro_ = 0;           // micro-batches finished since the last step
  bool overlap_, per_micro_;  // per_micro_: zero 2 reducing every micro-batch
  bool reduce_in_backward_ = false;
  int64_t t_ = 0;
  double comm_seconds_ = 0, optim_seconds_ = 0;
  // zero 3
  std::vector<ModuleBuffer> gathered_, grad_bufs_;  // the module buffers (above)
  std::vector<int> piece_of_module_;                // by module index
  std::vector<int> pending_;                        // reported ready, reduction not yet issued
  uint64_t uses_ = 0;
  std::unique_ptr<parallel::CommThread> gather_thread_;
  // delayed_update
  std::thread worker_;
  std::exception_ptr worker_error_;
  double worker_seconds_ = 0;
};

// The ZeRO optimizers of one rank, one per module group it holds (parallel/topology.h: a pipeline stage holds
// modules that different sets of ranks share), driven as one. The program's ready hook reaches the optimizer of
// each module, and the reductions, steps and gathers run in module order, so that ranks sharing several groups
// meet their collectives in the same order.
class ZeroOptimizers {
 public:
  ZeroOptimizers();
  ZeroOptimizers(const ZeroOptimizers&) = delete;  // the ready hook captures `this`
  ZeroOptimizers& operator=(const ZeroOptimizers&) = delete;
  // Optimizers are added in module order and cover disjoint modules.
  void add(std::unique_ptr<ZeroOptimizer> opt);
  const std::vector<std::unique_ptr<ZeroOptimizer>>& all() const { return opts_; }

  const ModuleReadyFn& ready_hook() const { return ready_; }
  void before_last_micro_batch();
  void after_micro_batch();
  double reduce_gradients();  // this rank's share of the squared global norm, over its optimizers
  ZeroStepStats step(double lr, double grad_norm, bool skip = false);  // times summed over the optimizers
  void drain();
  int stage() const;
  // What the program reads its weights through: at zero 3 the optimizer (one module group), else null (the
  // backend's buffers).
  ParamSource* param_source();

 private:
  std::vector<std::unique_ptr<ZeroOptimizer>> opts_;
  std::vector<ZeroOptimizer*> of_module_;  // by module index
  ModuleReadyFn ready_;
};

// The end of a training step, after the last micro-batch's backward and after_micro_batch(): reduce the gradients,
// the global norm from every rank's share (`world`: all the ranks of the run, each with its optimizers), clip,
// update; a non-finite `loss` (the step's, when the caller has it) or norm skips the update. Collective over
// `world`. The stats' comm_seconds include the norm's reduction.
ZeroStepStats end_step(ZeroOptimizer& opt, Communicator& world, double lr, double loss = 0);
ZeroStepStats end_step(ZeroOptimizers& opts, Communicator& world, double lr, double loss = 0);

}  // namespace yuan
