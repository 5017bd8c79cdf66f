// ZeRO data-parallel AdamW. The fp32 master weights and the AdamW moments are sharded over the data-parallel
// ranks, in host memory (ZeRO-Offload, optim.offload = host) or on the device (optim.offload = none); the backend
// keeps the working weights and gradients (see backend/backend.h).
//
//   zero 0: gradients all-reduced, every rank holds and updates the whole optimizer state.
//   zero 1: gradients reduce-scattered once per step; rank r holds and updates shard r of the master weights
//           and moments (1/N of the bytes), then the weights are all-gathered.
//   zero 2: as 1, but each finished bucket is reduce-scattered during backward of every micro-batch and
//           accumulated into the host gradient shard, so no rank keeps a full gradient across micro-batches
//           (with the state on the device the backend's gradient is whole anyway: reduced as at zero 1).
//   zero 3: as 2, and the working weights are sharded too: the backend holds 1/N of every module, and the
//           optimizer, as the program's ParamSource, all-gathers a module where forward or backward uses it and
//           reduce-scatters its gradient as soon as backward reports it ready, into the host gradient shard or,
//           with the state on the device, into a gradient shard there.
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
// ZeroOptimizer composes one unit per job, each in its own files:
//   zero_spec.h      what the optimizer is before it allocates: shard, buckets, the sizes of its host buffers
//                    (the memory plan sums the same walk of the buffers that the units allocate);
//   grad_buckets.h   the host gradient and the buckets that reduce into it, as modules finish in backward;
//   host_adamw.h     the sharded master weights and moments, the tiled AdamW with its two upload lanes, bf16
//                    staging, bucket by bucket in the order the next forward reads them, each bucket's all-gather
//                    (zero 1 and 2) going out while the next updates; the next forward waits on the device for
//                    the gathers, the host for none;
//   device_adamw.h   the same state on the device instead (optim.offload = none), updated by the backend's adamw
//                    op from the reduced gradient on the device (the backend's, or at zero 3 its own shard of it);
//   delayed_update.h the thread that runs an update beside the next step (optim.delayed_update);
//   zero3_params.h   zero 3's ParamSource: module buffers, gathers with prefetch, per-module reduce-scatter.
// On host backends every transfer is a copy.
//
// optim.delayed_update: step t's AdamW runs on a host thread while step t+1's forward and backward run, and its
// weights reach the backend at the start of step t+2's. That is a different algorithm: the gradient of step t is
// taken at the weights of step t-2 (those of step 0 for t <= 1), w_t = AdamW(w_{t-1}, grad L(w_{t-2}; batch_t)).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "optim/delayed_update.h"
#include "optim/device_adamw.h"
#include "optim/grad_buckets.h"
#include "optim/host_adamw.h"
#include "optim/zero3_params.h"
#include "optim/zero_spec.h"
#include "program/program.h"

namespace yuan {

// Host memory of a rank's optimizer with buffers of sizes `s`, summed over the walk its units' constructors
// allocate by: the optimizer state (Mem::Optimizer: master weights, both moments, the gradient or two) and the
// transfer staging (Mem::Comm: the incoming gradient of later micro-batches, bf16 weights on their way up).
struct ZeroHostMemory {
  size_t optimizer = 0, staging = 0;
};
ZeroHostMemory zero_host_memory(const ZeroSizes& s);
// Device memory of the optimizer state with buffers of sizes `s` (0 unless s.device).
size_t zero_device_memory(const ZeroSizes& s);
// Host bytes of optimizer state of a shard of `shard` elements (zero_host_memory's `optimizer`). Rank 0's shard
// is the largest.
size_t zero_optimizer_bytes(size_t shard, bool delayed_update = false);

// The host placement's part of a step (optim.offload = host): what crossed between host and device, and the host
// seconds each part kept the step waiting. The transfers themselves run beside compute and the AdamW; their own
// durations are the kernel account's (profile.kernels).
struct OffloadSplit {
  uint64_t down_bytes = 0;  // reduced gradients into host memory (fp32; at zero 2 and 3 once per micro-batch)
  uint64_t up_bytes = 0;    // updated working weights into the device
  double grads_wait = 0;    // waiting for the gradients' reductions and copies once backward is done
  double adamw = 0;         // the AdamW on the step's critical path (with delayed_update it is background_seconds)
  double weights_wait = 0;  // waiting for a staging lane (the uploads and gathers land on the device, where the
                            // next forward waits for them)
  OffloadSplit& operator+=(const OffloadSplit& o);
};

struct ZeroStepStats {
  double grad_norm = 0;           // global L2 norm before clipping, as passed to step()
  double comm_seconds = 0;        // host time in and waiting for collectives and gradient copies since last step
  double optim_seconds = 0;       // host time of the update on the critical path: norm, AdamW, weight upload
                                  // (delayed_update: norm, waiting for the previous update, its upload)
  double background_seconds = 0;  // delayed_update: the AdamW that ran on the worker thread beside compute
  bool skipped = false;           // no update: the norm was not finite, or the caller asked to skip
  std::optional<OffloadSplit> offload;  // with the optimizer state on the host
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
  // `gathers`: zero 3 with a host communicator, a duplicate of `comm` (comm/groups.h) on which the gathers run
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
  void before_last_micro_batch() { buckets_.before_last_micro_batch(); }
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

  // ParamSource, at zero 3 (optim/zero3_params.h).
  void acquire(int module, bool grads) override { zero3("acquire").acquire(module, grads); }
  void release(int module) override { zero3("release").release(module); }
  Tensor weight(const TensorSpec& t) const override { return zero3("weight").weight(t); }
  Tensor grad(const TensorSpec& t) const override { return zero3("grad").grad(t); }

  ZeroStage stage() const { return spec_.cfg.zero; }
  int group_rank() const { return comm_.rank(); }
  const TensorParallel& tensor_parallel() const { return layout_.tp(); }
  const ModuleRange& modules() const { return spec_.modules; }
  size_t shard_offset() const { return spec_.shard_off; }  // in the backend's flat buffer
  size_t shard_size() const { return spec_.shard_n; }
  // Where the shard's values (in master() order) belong in the model; one piece below zero 3, one per module at it.
  std::vector<ShardPiece> shard_pieces() const;
  // Optimizer state of this rank's shard (shard_size() values each), for checkpoints; not while an update is in
  // flight (drain() first).
  float* master();
  float* exp_avg();
  float* exp_avg_sq();
  int64_t adam_step() const { return host_ ? host_->step() : device_->step(); }
  void set_adam_step(int64_t s) { host_ ? host_->set_step(s) : device_->set_step(s); }
  bool on_device() const { return device_ != nullptr; }
  // After master() was overwritten (checkpoint restore): push it into the backend's working weights.
  void load_backend_params();

 private:
  ZeroOptimizer(const ParamLayout& layout, const OptimConfig& cfg, Backend& backend, Communicator& comm,
                const ParamInit& init, ModuleRange modules, bool overlap, std::unique_ptr<Communicator> gathers,
                HostBuffers&& buffers);
  Zero3Params& zero3(const char* what) const;  // the ParamSource, or the error that this stage has none
  void module_ready(int module);
  // The updated shard into every rank's backend: all-gathered bucket by bucket (zero 1, 2) or invalidated (3);
  // published(), once the buckets' gathers are issued (by the host AdamW, as it goes), orders the backend's compute
  // after them on the device, and the host does not wait.
  void publish();
  void published();
  // The host AdamW's callback: bucket b's part of this rank's shard is on its way up; its gather goes out.
  HostAdamW::BucketUploaded gather_uploaded();
  // The host path, once the whole shard is on its way up: published(), its wait from `since` and the shard's bytes
  // counted in the offload split.
  void land_uploads(double since);
  // With the state on the device below zero 3: the backend's gradients, which the AdamW has read (or which a
  // skipped step drops), zeroed for the next step's backward to add into. The host path zeroes them as they are
  // copied out (GradientBuckets), and at zero 3 the step's first micro-batch writes the device gradient shard.
  void drop_backend_grads();
  double land_delayed();  // the delayed update finished, its weights uploaded and published; its seconds
  void check_no_update_in_flight(const char* what) const;
  bool update_in_flight() const;  // a delayed update not yet landed (on the host's thread, or set aside)

  const ParamLayout layout_;  // the backend's: the modules' offsets in its flat buffers
  const ZeroSpec spec_;
  Backend& backend_;
  Communicator& comm_;
  size_t global_off_ = 0;  // where the range starts in the model's buffer as this tensor rank holds it
  double comm_seconds_ = 0, optim_seconds_ = 0;
  OffloadSplit split_;  // the host placement's, since the last step()
  HostGradient grad_;
  GradientBuckets buckets_;
  std::unique_ptr<HostAdamW> host_;      // the state in host memory, or
  std::unique_ptr<DeviceAdamW> device_;  // on the device
  std::optional<ops::AdamWHyper> saved_;  // on the device with delayed_update: the set-aside gradient's update
  std::unique_ptr<Zero3Params> zero3_;  // zero 3 only
  DelayedUpdate delayed_;
  ModuleReadyFn ready_;
};

// The ZeRO optimizers of one rank, one per module group it holds (layout/topology.h: a pipeline stage holds
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
  ZeroStage stage() const;
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
