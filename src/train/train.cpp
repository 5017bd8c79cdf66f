// The training loop: every rank runs the same steps on its slice of the global batch.
//
//   for each step:  the schedule's passes (layout/schedule.h) over this rank's micro-batches:
//                     forward: loader -> program.forward -> program.loss (the head's backward with it)
//                     backward: program.backward (the ZeRO hook reduces finished buckets)
//                   optimizer: reduce the gradients, the global norm over the world, clip/AdamW on the shard,
//                   gather the weights into the backend
//
// Gradients of micro-batch losses are scaled by 1/(data-parallel ranks * accum) so that the sum over ranks and
// micro-batches is the gradient of the mean loss over the global batch, whatever the number of ranks.
#include "train/train.h"

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#include "config/config.h"
#include "data/loader.h"
#include "data/manifest.h"
#include "layout/layout.h"
#include "layout/nodes.h"
#include "layout/schedule.h"
#include "layout/topology.h"
#include "optim/lr_schedule.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "train/checkpoint.h"
#include "train/local_ckpt.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/stage_runner.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"

namespace yuan {
namespace {

// Test hooks (tests/mpi): YUANLM_FAIL_AT=RANK:STEP throws on that rank at that step; YUANLM_KILL_AT=STEP
// SIGKILLs rank 0 in the middle of that step (after backward, before the update); YUANLM_NAN_STEPS=A:B makes
// the gradients of steps [A, B) NaN.
struct FaultInjection {
  int fail_rank = -1, fail_step = -1, kill_step = -1, nan_from = -1, nan_to = -1;
  FaultInjection() {
    if (const char* f = std::getenv("YUANLM_FAIL_AT")) std::sscanf(f, "%d:%d", &fail_rank, &fail_step);
    if (const char* f = std::getenv("YUANLM_KILL_AT")) kill_step = std::atoi(f);
    if (const char* f = std::getenv("YUANLM_NAN_STEPS")) std::sscanf(f, "%d:%d", &nan_from, &nan_to);
  }
};

// The rank whose step's compute took longest, and what it cost the step: its compute beyond the middle rank's
// (the lower median: with two ranks, the other one), which the others spend waiting for it at the step's collectives. On rank 0, from every
// rank's compute seconds; elsewhere (no values) rank 0 at no cost.
struct Straggler {
  int rank = 0;
  double cost_s = 0;
  double work_s = 0;  // the slowest rank's compute: the rest of the step every rank spent waiting
};
Straggler slowest_rank(const std::vector<double>& compute) {
  if (compute.empty()) return {};
  std::vector<double> sorted = compute;
  const auto middle = sorted.begin() + (sorted.size() - 1) / 2;
  std::nth_element(sorted.begin(), middle, sorted.end());
  const auto slowest = std::max_element(compute.begin(), compute.end());
  return {static_cast<int>(slowest - compute.begin()), *slowest - *middle, *slowest};
}

// A run directory has one owner: rank 0 holds a lock on run.dir/.lock for the whole run, taken before anything is
// written there, so that a second training on the same directory (a duplicate submission, a requeue that starts
// before the old job ended) cannot resume from the first's checkpoints, overwrite them and mix metrics.jsonl.
// Collective: every rank gets rank 0's verdict. A run refused before it wrote anything (memory, a bad resume)
// leaves no trace: a directory it created only for the lock goes again.
class RunDirOwner {
 public:
  explicit RunDirOwner(const std::string& dir) : dir_(dir) {
    std::string refusal;
    if (comm::world().rank == 0) {
      const std::string path = dir + "/.lock";
      const char* job = std::getenv("SLURM_JOB_ID");
      const std::time_t now = std::time(nullptr);
      char started[32];
      std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
      const std::string me = strf("host %s, pid %d, started %s%s", comm::world().host.c_str(),
                                  static_cast<int>(::getpid()), started,
                                  job ? strf(", SLURM job %s", job).c_str() : "");
      std::string other;
      try {
        created_ = !std::filesystem::exists(dir);
        make_dirs(dir);
        switch (lock_.acquire(path, me, &other)) {
          case FileLock::Taken: break;
          case FileLock::Held:
            refusal = strf("run.dir %s is in use by another training (%s; it holds %s): one run per directory; "
                           "wait for it to end or give this one another run.dir",
                           dir.c_str(), other.empty() ? "its holder is starting" : other.c_str(), path.c_str());
            break;
          case FileLock::Unsupported:
            warn("cannot lock %s (%s: the filesystem has no flock, e.g. Lustre without -o flock): a second training "
                 "on run.dir %s would not be refused",
                 path.c_str(), other.c_str(), dir.c_str());
            break;
        }
      } catch (const Error& e) {
        refusal = e.what();
      }
    }
    refusal = comm::broadcast_string(refusal, 0);
    if (!refusal.empty()) throw Error(refusal, true);
  }
  ~RunDirOwner() {
    if (!created_ || std::uncaught_exceptions() == exceptions_) return;
    // The lock file goes before the lock: a run that opens it meanwhile is refused, and one after makes a new one.
    std::error_code ec;
    std::filesystem::directory_iterator it(dir_, ec), end;
    if (!ec && it != end && it->path().filename() == ".lock" && ++it == end) {
      std::filesystem::remove(dir_ + "/.lock", ec);
      std::filesystem::remove(dir_, ec);
    }
  }
  RunDirOwner(const RunDirOwner&) = delete;
  RunDirOwner& operator=(const RunDirOwner&) = delete;

 private:
  std::string dir_;
  bool created_ = false;  // rank 0 made the directory for the lock
  const int exceptions_ = std::uncaught_exceptions();
  FileLock lock_;
};

class Trainer {
 public:
  explicit Trainer(const Config& cfg)
      : cfg_(cfg),
        world_(comm::world()),
        groups_(layout::make_topology(cfg, world_.size)),
        place_(groups_.topology().place(world_.rank)),
        stages_(groups_.topology().stages_of(world_.rank)),
        schedule_(layout::parse_schedule(cfg.parallel.schedule), place_.stage, stages_, pipeline().micro_batches) {
    base_host_bytes_ = host_rss_bytes();
    micro_total_ = cfg.train.global_batch / cfg.train.micro_batch;
    device_ = resolve_device(parse_device(cfg.train.device, "train.device"));
    const int device_index = select_device(device_, world_.local_rank);  // ranks that share one share its memory
    // The optimizer's placement, then the plan with it: what the replica is built from.
    const OffloadChoice offload = choose_offload(cfg, groups_.topology(), device_, world_.rank, device_index);
    optim_ = cfg.optim;
    optim_.offload = offload.offload;
    offload_why_ = offload.why;
    Config planned = cfg;
    planned.optim = optim_;
    const RankPlan plan = plan_rank(planned, groups_.topology(), device_, world_.rank);
    attention_ = plan.attention;
    check_node_memory(plan.memory, device_index, memory_hint(planned, world_.size, plan.memory));
    n_params_ = ParamLayout(cfg.model).total();
    flops_per_token_ = flops_per_token(cfg.model, n_params_);
    build_replica(plan);
    if (!cfg.profile.kernels.empty()) {
      kernels_ = replica_.backend->kernel_account();
      YUAN_CHECK(kernels_, "profile.kernels: the %s backend keeps no kernel account", replica_.backend->name());
    }
    runner_ = std::make_unique<StageRunner>(*replica_.program, *replica_.backend,
                                            stages_ > 1 ? &groups_.communicator(comm::Group::Pipeline) : nullptr,
                                            place_.stage, stages_, cfg.train.micro_batch);
    tokenizer_ = find_tokenizer_for(cfg.data.train);
    int64_t run = 1;
    std::string from;
    state_ = resume_best_tier(cfg, choose_resume(cfg), *replica_.opts, &run, &from);
    if (from.empty() && !cfg.init.from.empty()) load_hf_init(cfg.init.from, cfg, *replica_.opts);
    state_.run = run;
    if (cfg.ckpt.local_every > 0) local_ = std::make_unique<LocalTier>(cfg, *replica_.opts);
    open_loaders();
    set_hooks();
    peak_ = replica_.backend->peak_flops();
    if (world_.rank == 0) {
      make_dirs(cfg.run.dir);
      write_file_atomic(cfg.run.dir + "/config.ini", cfg.to_ini());
      record_run(cfg.run.dir, state_.run, state_.step, from);
      truncate_metrics(cfg.run.dir + "/metrics.jsonl", state_.step);
      metrics_ = std::make_unique<MetricsLog>(cfg.run.dir + "/metrics.jsonl");
    }
  }

  // Returns the process exit code: 0 when all steps ran, kExitRequeue after a stop signal.
  int run() {
    const Config& c = cfg_;
    describe_run();
    if (state_.step >= c.train.steps) {
      say("nothing to do: the checkpoint is at step %lld of %d", static_cast<long long>(state_.step), c.train.steps);
      return 0;
    }
    first_step_ = saved_step_ = state_.step;
    // A signal during start-up (MPI, a checkpoint's load, the data checks) is acted on here, before any step.
    if (!evaluate(state_.step) || comm::agreed_stop_signal()) return stop_for_requeue();
    const double start = now_seconds();
    for (int step = static_cast<int>(first_step_); step < c.train.steps; step++) {
      StepMetrics m = run_step(step);
      log_step(m);
      if (local_) local_->seal();  // the step's record first: no checkpoint is resumed from whose step has none
      count_bad_steps(m);
      if (comm::agreed_stop_signal()) return stop_for_requeue();
      maybe_checkpoint(m.step);
      if (!maybe_evaluate(m.step)) return stop_for_requeue();
    }
    if (!evaluate(c.train.steps)) return stop_for_requeue();
    checkpoint();
    if (local_) local_->finish();
    remove_local_checkpoints(cfg_);  // run.dir/ckpt holds the last step
    const double elapsed = now_seconds() - start;
    const int steps = c.train.steps - static_cast<int>(first_step_);
    say("done: %d steps in %s, %.0f tokens/s average", steps, format_duration(elapsed).c_str(),
        steps * tokens_per_step() / elapsed);
    return 0;
  }

 private:
  const layout::Pipeline& pipeline() const { return groups_.topology().pipelines()[place_.pipeline]; }
  double tokens_per_step() const { return static_cast<double>(cfg_.train.global_batch) * cfg_.model.seq_len; }
  bool pipelined() const {
    const layout::Topology& topo = groups_.topology();
    return topo.world_size() > static_cast<int>(topo.pipelines().size());
  }
  // Every scalar the trainer sums over the ranks (the loss, the squared gradient norm, the val loss) goes through
  // the world group's communicator.
  Communicator& world_comm() { return groups_.communicator(comm::Group::World); }

  // The backend, the ZeRO optimizers of this rank's module groups and the program, and the communicators they use.
  void build_replica(const RankPlan& plan) {
    const Config& cfg = cfg_;
    const layout::Topology& topo = groups_.topology();
    const ParamLayout& layout = plan.layout;
    assemble_replica(replica_, {device_, layout, plan.backend, plan.program}, [&](Replica& r) -> Communicator* {
      groups_.set_device(device_, r.backend->stream(), cfg.dist.nccl_timeout_s);
      world_comm();  // made now, so that its set-up (NCCL's is collective and slow) is not timed in the first step
      // Reductions overlap backward only where every member of a group runs the same passes independently: with
      // pipelines, a rank waiting in a reduction could hold up the neighbour its group partner waits for.
      const bool overlap = topo.replicas_only();
      const ParamInit init([&](size_t offset, size_t count, float* dst) {
        init_gpt2(layout, cfg.train.seed, dst, offset, count);
      });
      for (size_t i = 0; i < groups_.data_modules().size(); i++) {
        const int index = static_cast<int>(i);
        const comm::ProcessGroup& data = groups_.get(comm::Group::Data, index);
        // ZeRO-3 on the host gathers on a thread of its own, over its own copy of the group's communicator.
        std::unique_ptr<Communicator> gathers;
        if (cfg.optim.zero.shards_weights() && device_ == Device::Cpu && data.size() > 1 && world_.thread_multiple)
          gathers = groups_.gather_communicator(index);
        gather_thread_ = gathers != nullptr;
        r.opts->add(std::make_unique<ZeroOptimizer>(optim_, *r.backend, layout,
                                                    groups_.communicator(comm::Group::Data, index), init,
                                                    groups_.data_modules()[i], overlap, std::move(gathers)));
      }
      return layout.tp().size > 1 ? &groups_.communicator(comm::Group::Tensor) : nullptr;
    });
  }

  // Both ends of a pipeline read its micro-batches: the first stage embeds them, the last takes the targets.
  void open_loaders() {
    if (!replica_.program->embeds() && !replica_.program->runs_head()) return;
    const Config& cfg = cfg_;
    LoaderSpec spec;
    spec.glob = cfg.data.train;
    spec.seq_len = cfg.model.seq_len;
    spec.vocab_size = cfg.model.vocab_size;
    spec.seed = cfg.train.seed;
    spec.global_batch = cfg.train.global_batch;
    spec.micro_batch = cfg.train.micro_batch;
    spec.prefetch = cfg.data.prefetch;
    const layout::MicroBatches mine = groups_.topology().micro_batches_of(world_.rank);
    spec.slice_first = mine.first * spec.micro_batch;
    spec.slice_count = mine.count * spec.micro_batch;
    loader_ = std::make_unique<TrainLoader>(spec, state_.next_sample);
    if (!cfg.data.val.empty()) {
      spec.glob = cfg.data.val;
      spec.rank = place_.pipeline;
      spec.world = static_cast<int>(groups_.topology().pipelines().size());
      val_ = std::make_unique<ValLoader>(spec, cfg.train.eval_batches);
    }
  }

  // What the passes call back: the loader (timed), and the optimizers' hooks around the micro-batches.
  void set_hooks() {
    hooks_.tokens = [this] {
      replica_.backend->range_push("data");
      const double w0 = loader_->wait_seconds();
      const int32_t* t = loader_->next_micro_batch();
      data_wait_ += loader_->wait_seconds() - w0;
      replica_.backend->range_pop();
      return t;
    };
    hooks_.ready = replica_.opts->ready_hook();
    hooks_.before_forward = [this](int micro) {
      if (micro == pipeline().micro_batches - 1) replica_.opts->before_last_micro_batch();
    };
    hooks_.after_backward = [this] { replica_.opts->after_micro_batch(); };
  }

  // The start-up lines: the model, the layout, the optimizer, the val set, the memory and the peak MFU counts against.
  void describe_run() const {
    const Config& c = cfg_;
    say("model: %zu parameters (%.1fM), %.3g FLOPs/token (6N + 12LCT), %d layers x %d heads x %d, seq %d, vocab %d",
        n_params_, n_params_ / 1e6, flops_per_token_, c.model.n_layer, c.model.n_head, c.model.n_embd,
        c.model.seq_len, c.model.vocab_size);
    describe_layout();
    say("ZeRO stage %d, backend %s, optimizer on the %s (%s)%s%s", replica_.opts->stage().number(),
        replica_.backend->name(), optimizer_on_device(optim_) ? "device" : "host", offload_why_.c_str(),
        c.optim.delayed_update ? " with a one-step delayed update" : "",
        !replica_.opts->stage().shards_weights() || device_ != Device::Cpu ? ""
        : gather_thread_                            ? "; modules gathered on a communication thread"
                                                    : "; modules gathered in the compute thread (MPI has no "
                                                      "MPI_THREAD_MULTIPLE, or one rank)");
    say("attention: %s%s", attention_path_name(attention_.path),
        attention_.why.empty() ? "" : strf(" (%s)", attention_.why.c_str()).c_str());
    say("val: %s", !c.data.val.empty() ? strf("%d micro-batches per pipeline from %s", c.train.eval_batches,
                                               c.data.val.c_str()).c_str()
                                        : "none (data.val is empty)");
    say("host memory of rank 0: params %s, grads %s, optimizer %s, activations %s; MFU against %.4g TFLOP/s per "
        "rank (%s)",
        format_bytes(mem_bytes(Mem::Params)).c_str(), format_bytes(mem_bytes(Mem::Grads)).c_str(),
        format_bytes(mem_bytes(Mem::Optimizer)).c_str(), format_bytes(mem_bytes(Mem::Activations)).c_str(),
        peak_.flops / 1e12, peak_.source.c_str());
  }

  void describe_layout() const {
    const layout::Topology& topo = groups_.topology();
    const layout::NodeMap& nodes = comm::node_map();
    const std::vector<layout::GroupSpan> spans = layout::group_spans(topo, nodes);
    for (const std::string& line : layout::describe_layout(cfg_, topo)) say("%s", line.c_str());
    for (const std::string& line : layout::describe_nodes(nodes, spans)) say("%s", line.c_str());
    for (const std::string& w : layout::tensor_crossing_warnings(spans, nodes, topo.tp_size())) warn("%s", w.c_str());
  }

  // One optimizer step: this rank's passes over its micro-batches, then the end of the step (the reduction, the
  // global norm, the update); returns the step's figures.
  StepMetrics run_step(int step) {
    const Config& c = cfg_;
    const auto [profile_first, profile_last] = c.profile.window();
    if (step + 1 == profile_first) replica_.backend->profiler(true);
    const auto [account_first, account_last] = c.profile.kernel_window();
    const bool accounted = kernels_ && step + 1 >= account_first && step + 1 <= account_last;
    if (accounted) kernels_->begin_step();
    StepMetrics m;
    const double t0 = now_seconds();
    comm::take_waited_seconds();  // waits between steps (the previous step's gathers) belong to none
    m.traffic_start = groups_.traffic();
    m.lr = lr_at(c.optim, step, c.train.steps);
    const double loss = run_micro_batches(step);
    const double t_compute = now_seconds();
    if (world_.rank == 0 && step == faults_.kill_step) std::raise(SIGKILL);
    m.loss = world_comm().sum(loss) / micro_total_;
    replica_.backend->range_push("optimizer");
    const ZeroStepStats st = end_step(*replica_.opts, world_comm(), m.lr, m.loss);
    replica_.backend->range_pop();
    m.step_s = now_seconds() - t0;
    if (accounted) kernels_->end_step();  // reads the step's events: after the step's clock
    if (accounted && step + 1 == account_last) report_kernels();
    const comm::LongestWait wait = comm::take_longest_wait();
    m.wait_max_s = wait.seconds;
    if (wait.seconds > stall_.seconds) stall_ = wait;
    m.step = step + 1;
    m.steps = c.train.steps;
    if (m.step == profile_last) replica_.backend->profiler(false);
    state_.step = m.step;
    state_.next_sample += static_cast<uint64_t>(c.train.global_batch);
    m.tokens_per_s = tokens_per_step() / m.step_s;
    m.mfu = m.tokens_per_s * flops_per_token_ / (peak_.flops * world_.size);
    if (!(m.mfu <= 1)) {  // a figure that cannot be true is not shown: the peak was not what the ranks have
      if (!mfu_refused_)
        warn("step %d: MFU would read %.0f%% against the peak measured at start (%.4g TFLOP/s per rank, %s): that peak "
             "is below what the steps reach; MFU is not shown from here on",
             m.step, 100 * m.mfu, peak_.flops / 1e12, peak_.source.c_str());
      mfu_refused_ = true;
    }
    if (mfu_refused_) m.mfu = NAN;
    m.grad_norm = st.grad_norm;
    m.data_s = data_wait_;
    m.compute_s = t_compute - t0 - data_wait_;
    m.comm_s = st.comm_seconds;
    m.optim_s = st.optim_seconds;
    m.optim_background_s = st.background_seconds;
    m.offload = st.offload;
    m.skipped = st.skipped;
    m.tokens = static_cast<long long>(m.step * tokens_per_step());
    const Straggler slow = slowest_rank(comm::gather(m.step_s - comm::take_waited_seconds()));
    m.slowest_rank = slow.rank;
    m.slowest_host = comm::world_hosts()[slow.rank];
    m.straggler_s = slow.cost_s;
    m.all_wait_s = slow.work_s > 0 ? std::max(0.0, m.step_s - slow.work_s) : 0.0;
    measure_bubble(m);
    m.peak_host_bytes = host_peak_rss_bytes();
    m.base_host_bytes = base_host_bytes_;
    m.traffic_end = groups_.traffic();
    // The fast tier's copy is part of every step it is taken after, for the ETA; its waits are not the step's.
    m.local_ckpt_s = maybe_local_checkpoint(m.step);
    if (step > first_step_) timed_ += m.step_s + m.local_ckpt_s;  // the first step pays for warm-up
    const double per_step = step > first_step_ ? timed_ / (step - first_step_) : m.step_s + m.local_ckpt_s;
    m.eta_s = per_step * (c.train.steps - m.step);
    return m;
  }

  // After the account's last step: the table on rank 0, and every rank's own file in run.dir (pipeline stages and
  // tensor ranks run different work): kernels.json on rank 0, kernels.rank<R>.json elsewhere.
  void report_kernels() {
    KernelReport r = kernels_->report();
    std::tie(r.first, r.last) = cfg_.profile.kernel_window();
    if (world_.rank == 0) say("%s", kernel_table(r).c_str());
    const std::string name = world_.rank == 0 ? "kernels.json" : strf("kernels.rank%d.json", world_.rank);
    make_dirs(cfg_.run.dir);
    write_file_atomic(cfg_.run.dir + "/" + name, kernel_json(r));
    kernels_.reset();  // its events go
  }

  // The schedule's passes over this rank's micro-batches (with the test hooks' faults); returns the sum of the
  // micro-batch losses this rank reports (0 on ranks that report none).
  double run_micro_batches(int step) {
    YUAN_CHECK(!(world_.rank == faults_.fail_rank && step == faults_.fail_step),
               "injected failure at step %d (YUANLM_FAIL_AT)", step);
    data_wait_ = 0;
    const float scale = step >= faults_.nan_from && step < faults_.nan_to ? NAN : 1.0f / micro_total_;
    // Every tensor rank of a last stage computes the same losses: its rank 0 reports them.
    return runner_->run(schedule_, scale, hooks_) * (place_.tp_rank == 0);
  }

  // The pipeline bubble: the share of the passes' time each stage spends waiting, against the longest stage's (the
  // ranks start the passes together, after the previous step's collectives), averaged over the stages. Collective.
  void measure_bubble(StepMetrics& m) {
    std::vector<double> busy = comm::gather(runner_->compute_seconds());
    const std::vector<double> spans = comm::gather(runner_->step_seconds());
    double bubble = 0;
    if (!spans.empty()) {
      const double span = *std::max_element(spans.begin(), spans.end());
      for (double& b : busy) {
        b /= span;
        bubble += (1 - b) / busy.size();
      }
    }
    if (!pipelined()) return;
    m.bubble = bubble;
    m.stage_busy = std::move(busy);
  }

  void log_step(StepMetrics& m) {
    const Config& c = cfg_;
    if (m.step % c.train.log_every == 0 || m.step == c.train.steps || m.skipped) {
      // The longest wait since the previous line, when it took more than a tenth of the deadline (the watchdog's
      // own resolution).
      if (stall_.seconds > c.dist.timeout_s / 10) m.stall = stall_;
      stall_ = {};
      say("%s", step_line(m).c_str());
    }
    if (metrics_) metrics_->write(step_record(m));
  }

  // A skipped update is warned about; train.max_bad_steps in a row end the run, with the weights from before them
  // saved.
  void count_bad_steps(const StepMetrics& m) {
    if (!m.skipped) {
      bad_run_ = 0;
      return;
    }
    warn("step %d: non-finite %s, update skipped (%d in a row, train.max_bad_steps %d)", m.step,
         std::isfinite(m.loss) ? "gradient norm" : "loss", ++bad_run_, cfg_.train.max_bad_steps);
    if (bad_run_ < cfg_.train.max_bad_steps) return;
    const std::string dir = save();
    throw Error(strf("%d consecutive steps with a non-finite loss or gradient norm (steps %d-%d); %s holds the "
                     "weights from before them",
                     bad_run_, m.step - bad_run_ + 1, m.step, dir.c_str()),
                true);
  }

  // After `done` steps, every ckpt.every; run() writes the last step's.
  void maybe_checkpoint(int done) {
    if (cfg_.ckpt.every > 0 && done % cfg_.ckpt.every == 0 && done != cfg_.train.steps) checkpoint();
  }

  // After `done` steps, every ckpt.local_every but the last (run() checkpoints it to run.dir/ckpt). A delayed update
  // lands first, as for run.dir/ckpt's checkpoints: the snapshot holds the state after the step. Returns the seconds
  // it took this thread.
  double maybe_local_checkpoint(int done) {
    if (!local_ || done % cfg_.ckpt.local_every != 0 || done == cfg_.train.steps) return 0;
    const double t0 = now_seconds();
    replica_.opts->drain();
    local_->save(state_, *replica_.opts);
    return now_seconds() - t0;
  }

  // After `done` steps, every train.eval_every; run() evaluates the last step. False: a stop signal ended it.
  bool maybe_evaluate(int done) {
    if (cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0 && done != cfg_.train.steps)
      return evaluate(done);
    return true;
  }

  // Writes the state after the steps done so far (the pending update applied first) and returns its directory.
  std::string save() {
    replica_.opts->drain();
    std::string dir = save_checkpoint(cfg_, state_, *replica_.opts, tokenizer_);
    saved_step_ = state_.step;
    return dir;
  }

  void checkpoint() {
    replica_.opts->drain();  // before the clock starts: the time printed is the write's (save() finds it drained)
    const double t0 = now_seconds();
    const std::string dir = save();
    say("checkpoint %s (%.1f s)", dir.c_str(), now_seconds() - t0);
  }

  // After a stop signal that every rank saw (comm::agreed_stop_signal): checkpoints the steps done since the
  // last checkpoint, if any, and returns the exit code that asks for a requeue.
  int stop_for_requeue() {
    if (state_.step > saved_step_) {
      const std::string dir = save();
      say("stopped by a signal after step %lld; checkpoint %s; exit %d so the job can be requeued",
          static_cast<long long>(state_.step), dir.c_str(), kExitRequeue);
    } else {
      say("stopped by a signal %s: nothing to save, no checkpoint written; exit %d so the job can be requeued",
          state_.step == first_step_ ? "before the first step"
                                     : strf("at step %lld, which is checkpointed", static_cast<long long>(state_.step))
                                           .c_str(),
          kExitRequeue);
    }
    return kExitRequeue;
  }

  // Returns false when a stop signal ended the evaluation early (on every rank: the check is collective, after
  // each micro-batch, so that a large train.eval_batches cannot hold off a requeue).
  bool evaluate(int64_t step) {
    if (cfg_.data.val.empty()) return true;
    replica_.opts->drain();
    replica_.backend->range_push("eval");
    const std::optional<double> loss = runner_->evaluate(cfg_.train.eval_batches, [&](int i) { return val_->batch(i); },
                                                         [] { return comm::agreed_stop_signal() != 0; });
    replica_.backend->range_pop();
    if (!loss) return false;
    const double sum = *loss * (place_.tp_rank == 0);
    const double val = world_comm().sum(sum) /
                       (static_cast<double>(cfg_.train.eval_batches) * groups_.topology().pipelines().size());
    say("val    %6lld | val_loss %.4f", static_cast<long long>(step), val);
    if (metrics_) metrics_->write(JsonLine().add("step", static_cast<long long>(step)).add("val_loss", val));
    return true;
  }

  Config cfg_;
  OptimConfig optim_;        // cfg_.optim with optim.offload resolved (choose_offload)
  std::string offload_why_;  // and why, for the start-up line
  AttentionChoice attention_;  // whose attention kernels, and why (the start-up line)
  comm::WorldInfo world_;
  // Before the process groups, so destroyed after their communicators: the backend's teardown waits on streams
  // behind NCCL events (and cudaFree on the whole device) with no deadline; a communicator finalizes within
  // dist.nccl_timeout_s or aborts.
  Replica replica_;  // backend, optimizers, program
  std::unique_ptr<KernelAccount> kernels_;  // profile.kernels, until its last step; before the backend goes
  comm::ProcessGroups groups_;  // with the communicators and their traffic accounts
  layout::Place place_;
  int stages_;
  layout::Schedule schedule_;
  Device device_ = Device::Cpu;
  bool gather_thread_ = false;  // ZeRO-3's gathers run on a communication thread
  size_t base_host_bytes_ = 0;  // the process's resident memory before the model (MPI, libraries)
  FaultInjection faults_;
  int micro_total_ = 1;  // micro-batches per step over every pipeline
  size_t n_params_ = 0;
  double flops_per_token_ = 0;
  PeakFlops peak_;
  bool mfu_refused_ = false;  // a step's MFU read over 100%: the peak is not trusted for the rest of the run
  std::string tokenizer_;
  TrainState state_;
  int64_t first_step_ = 0, saved_step_ = 0;  // where this run started; the newest step in a checkpoint
  double timed_ = 0;                         // seconds of this run's steps after its first (for the ETA)
  comm::LongestWait stall_;              // the longest wait since the previous step line
  int bad_run_ = 0;                          // steps skipped in a row
  double data_wait_ = 0;                     // seconds the step so far waited for its micro-batches
  StageRunner::Hooks hooks_;
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<TrainLoader> loader_;
  std::unique_ptr<ValLoader> val_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<LocalTier> local_;  // ckpt.local_every > 0
};

}  // namespace

int train_main(const std::vector<std::string>& args) {
  Config cfg;
  if (!parse_config(args, "train", cfg)) return 0;
  // Compared before validation: a value that only some ranks refuse would leave the others waiting.
  comm::check_same_text_everywhere(cfg.hash(), cfg.to_ini(), "the resolved config", ini_difference);
  layout::validate(cfg, comm::world().size);
  comm::watch_waits(cfg.dist.timeout_s);
  const RunDirOwner owner(cfg.run.dir);
  say("# yuanlm train: resolved config\n%s", cfg.to_ini().c_str());
  return Trainer(cfg).run();
}

}  // namespace yuan
