// The training loop: every rank runs the same steps on its slice of the global batch.
//
//   for each step:  the schedule's passes (parallel/schedule.h) over this rank's micro-batches:
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
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "config/config.h"
#include "data/loader.h"
#include "data/manifest.h"
#include "optim/lr_schedule.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "parallel/communicator.h"
#include "parallel/groups.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "parallel/topology.h"
#include "parallel/watchdog.h"
#include "parallel/world.h"
#include "program/program.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/stage_runner.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"
#ifdef YUAN_CUDA
#include "backend/cuda_backend.h"
#endif

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
};
Straggler slowest_rank(const std::vector<double>& compute) {
  if (compute.empty()) return {};
  std::vector<double> sorted = compute;
  const auto middle = sorted.begin() + (sorted.size() - 1) / 2;
  std::nth_element(sorted.begin(), middle, sorted.end());
  const auto slowest = std::max_element(compute.begin(), compute.end());
  return {static_cast<int>(slowest - compute.begin()), *slowest - *middle};
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
    if (parallel::world().rank == 0) {
      const std::string path = dir + "/.lock";
      const char* job = std::getenv("SLURM_JOB_ID");
      const std::time_t now = std::time(nullptr);
      char started[32];
      std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
      const std::string me = strf("host %s, pid %d, started %s%s", parallel::world().host.c_str(),
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
    refusal = parallel::broadcast_string(refusal, 0);
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
        world_(parallel::world()),
        groups_(parallel::make_topology(cfg, world_.size)),
        place_(groups_.topology().place(world_.rank)),
        stages_(groups_.topology().stages_of(world_.rank)),
        schedule_(parallel::parse_schedule(cfg.parallel.schedule), place_.stage, stages_, pipeline().micro_batches) {
    const parallel::Topology& topo = groups_.topology();
    base_host_bytes_ = host_rss_bytes();
    micro_total_ = cfg.train.global_batch / cfg.train.micro_batch;
    device_ = resolve_device(parse_device(cfg.train.device, "train.device"));
    int gpu = -1;  // the device this rank uses (ranks that share one share its memory)
#ifdef YUAN_CUDA
    if (device_ == Device::Cuda) gpu = cuda_select_device(world_.local_rank);
#endif
    const RankPlan plan = plan_rank(cfg, topo, device_, world_.rank);
    const ParamLayout layout(cfg.model, plan.backend.modules, plan.backend.tp);
    check_node_memory(plan.memory, gpu, memory_hint(cfg, world_.size, plan.memory));
    n_params_ = ParamLayout(cfg.model).total();
    flops_per_token_ = flops_per_token(cfg.model, n_params_);
    assemble_replica(replica_, {device_, plan.backend, plan.program}, [&](Replica& r) -> Communicator* {
      world_comm_ = &communicator(parallel::Group::World);
      // Reductions overlap backward only where every member of a group runs the same passes independently: with
      // pipelines, a rank waiting in a reduction could hold up the neighbour its group partner waits for.
      const bool overlap = topo.replicas_only();
      const ParamInit init([&](size_t offset, size_t count, float* dst) {
        init_gpt2(layout, cfg.train.seed, dst, offset, count);
      });
      for (size_t i = 0; i < groups_.data_modules().size(); i++) {
        const parallel::ProcessGroup& data = groups_.get(parallel::Group::Data, static_cast<int>(i));
        // ZeRO-3 on the host gathers on a thread of its own, over its own copy of the group's communicator.
        std::unique_ptr<Communicator> gathers;
        if (cfg.optim.zero == 3 && device_ == Device::Cpu && data.size() > 1 && world_.thread_multiple) {
          gathers = parallel::make_mpi_communicator(data, parallel::kMpiChunk, true);
          gathers->count_into(&traffic_[static_cast<int>(parallel::Group::Data)]);
        }
        gather_thread_ = gathers != nullptr;
        r.opts->add(std::make_unique<ZeroOptimizer>(cfg.optim, *r.backend, communicator(parallel::Group::Data, i),
                                                    init, groups_.data_modules()[i], overlap, std::move(gathers)));
      }
      return plan.backend.tp.size > 1 ? &communicator(parallel::Group::Tensor) : nullptr;
    });
    runner_ = std::make_unique<StageRunner>(*replica_.program, *replica_.backend,
                                            stages_ > 1 ? &communicator(parallel::Group::Pipeline) : nullptr,
                                            place_.stage, stages_, cfg.train.micro_batch);
    tokenizer_ = find_tokenizer_for(cfg.data.train);
    const ResumeChoice resume = choose_resume(cfg);
    if (!resume.dir.empty()) state_ = load_checkpoint(resume.dir, cfg, *replica_.opts);
    state_.run = resume.run;

    // Both ends of a pipeline read its micro-batches: the first stage embeds them, the last takes the targets.
    if (replica_.program->embeds() || replica_.program->runs_head()) {
      LoaderSpec spec;
      spec.glob = cfg.data.train;
      spec.seq_len = cfg.model.seq_len;
      spec.vocab_size = cfg.model.vocab_size;
      spec.seed = cfg.train.seed;
      spec.global_batch = cfg.train.global_batch;
      spec.micro_batch = cfg.train.micro_batch;
      spec.prefetch = cfg.data.prefetch;
      for (int p = 0; p < place_.pipeline; p++) spec.slice_first += topo.pipelines()[p].micro_batches * spec.micro_batch;
      spec.slice_count = pipeline().micro_batches * spec.micro_batch;
      loader_ = std::make_unique<TrainLoader>(spec, state_.next_sample);
      if (!cfg.data.val.empty()) {
        spec.glob = cfg.data.val;
        spec.rank = place_.pipeline;
        spec.world = static_cast<int>(topo.pipelines().size());
        val_ = std::make_unique<ValLoader>(spec, cfg.train.eval_batches);
      }
    }
    peak_ = replica_.backend->peak_flops();
    if (world_.rank == 0) {
      make_dirs(cfg.run.dir);
      write_file_atomic(cfg.run.dir + "/config.ini", cfg.to_ini());
      truncate_metrics(cfg.run.dir + "/metrics.jsonl", state_.step);
      metrics_ = std::make_unique<MetricsLog>(cfg.run.dir + "/metrics.jsonl");
    }
  }

  // Returns the process exit code: 0 when all steps ran, kExitRequeue after a stop signal.
  int run() {
    const Config& c = cfg_;
    const parallel::Topology& topo = groups_.topology();
    say("model: %zu parameters (%.1fM), %.3g FLOPs/token (6N + 12LCT), %d layers x %d heads x %d, seq %d, vocab %d",
        n_params_, n_params_ / 1e6, flops_per_token_, c.model.n_layer, c.model.n_head, c.model.n_embd,
        c.model.seq_len, c.model.vocab_size);
    describe_layout();
    say("ZeRO stage %d, backend %s, optimizer on the host%s%s", replica_.opts->stage(), replica_.backend->name(),
        c.optim.delayed_update ? " with a one-step delayed update" : "",
        replica_.opts->stage() < 3 || device_ != Device::Cpu ? ""
        : gather_thread_                            ? "; modules gathered on a communication thread"
                                                    : "; modules gathered in the compute thread (MPI has no "
                                                      "MPI_THREAD_MULTIPLE, or one rank)");
    say("val: %s", !c.data.val.empty() ? strf("%d micro-batches per pipeline from %s", c.train.eval_batches,
                                               c.data.val.c_str()).c_str()
                                        : "none (data.val is empty)");
    say("host memory of rank 0: params %s, grads %s, optimizer %s, activations %s; MFU against %.4g TFLOP/s per "
        "rank (%s)",
        format_bytes(mem_bytes(Mem::Params)).c_str(), format_bytes(mem_bytes(Mem::Grads)).c_str(),
        format_bytes(mem_bytes(Mem::Optimizer)).c_str(), format_bytes(mem_bytes(Mem::Activations)).c_str(),
        peak_.flops / 1e12, peak_.source.c_str());
    if (state_.step >= c.train.steps) {
      say("nothing to do: the checkpoint is at step %lld of %d", static_cast<long long>(state_.step), c.train.steps);
      return 0;
    }

    first_step_ = saved_step_ = state_.step;
    // A signal during start-up (MPI, a checkpoint's load, the data checks) is acted on here, before any step.
    if (!evaluate(state_.step) || parallel::agreed_stop_signal()) return stop_for_requeue();
    const double tokens_per_step = static_cast<double>(c.train.global_batch) * c.model.seq_len;
    const double start = now_seconds();
    const int first = static_cast<int>(state_.step);
    const bool pipelined = topo.world_size() > static_cast<int>(topo.pipelines().size());
    double timed = 0;  // seconds of steps after the first, which pays for warm-up
    int bad_run = 0;
    const auto [profile_first, profile_last] = c.profile.window();
    StageRunner::Hooks hooks;
    double data_wait = 0;
    hooks.tokens = [&] {
      replica_.backend->range_push("data");
      const double w0 = loader_->wait_seconds();
      const int32_t* t = loader_->next_micro_batch();
      data_wait += loader_->wait_seconds() - w0;
      replica_.backend->range_pop();
      return t;
    };
    hooks.ready = replica_.opts->ready_hook();
    hooks.before_forward = [&](int micro) {
      if (micro == pipeline().micro_batches - 1) replica_.opts->before_last_micro_batch();
    };
    hooks.after_backward = [&] { replica_.opts->after_micro_batch(); };
    parallel::LongestWait stall;  // the longest wait since the previous step line
    for (int step = first; step < c.train.steps; step++) {
      if (step + 1 == profile_first) replica_.backend->profiler(true);
      const double t0 = now_seconds();
      parallel::take_waited_seconds();  // waits between steps (the previous step's gathers) belong to none
      std::copy(std::begin(traffic_), std::end(traffic_), step_start_traffic_);
      data_wait = 0;
      const double lr = lr_at(c.optim, step, c.train.steps);
      YUAN_CHECK(!(world_.rank == faults_.fail_rank && step == faults_.fail_step),
                 "injected failure at step %d (YUANLM_FAIL_AT)", step);
      const float scale = step >= faults_.nan_from && step < faults_.nan_to ? NAN : 1.0f / micro_total_;
      // Every tensor rank of a last stage computes the same losses: its rank 0 reports them.
      double loss = runner_->run(schedule_, scale, hooks) * (place_.tp_rank == 0);
      const double t_compute = now_seconds();
      if (world_.rank == 0 && step == faults_.kill_step) std::raise(SIGKILL);
      loss = parallel::allreduce_sum(loss) / micro_total_;
      replica_.backend->range_push("optimizer");
      const ZeroStepStats st = end_step(*replica_.opts, *world_comm_, lr, loss);
      replica_.backend->range_pop();
      const double t1 = now_seconds(), dt = t1 - t0;
      const parallel::LongestWait wait = parallel::take_longest_wait();
      if (wait.seconds > stall.seconds) stall = wait;
      const int done = step + 1;
      if (done == profile_last) replica_.backend->profiler(false);
      state_.step = done;
      state_.next_sample += static_cast<uint64_t>(c.train.global_batch);
      if (step > first) timed += dt;
      const double per_step = step > first ? timed / (step - first) : dt;
      const double tok_s = tokens_per_step / dt;
      const double mfu = tok_s * flops_per_token_ / (peak_.flops * world_.size);
      // The pipeline bubble: the share of the passes' time each stage spends waiting, against the longest stage's
      // (the ranks start the passes together, after the previous step's collectives), averaged over the stages.
      const Straggler slow = slowest_rank(parallel::gather(dt - parallel::take_waited_seconds()));
      std::vector<double> busy = parallel::gather(runner_->compute_seconds());
      const std::vector<double> spans = parallel::gather(runner_->step_seconds());
      double bubble = 0;
      if (!spans.empty()) {
        const double span = *std::max_element(spans.begin(), spans.end());
        for (double& b : busy) {
          b /= span;
          bubble += (1 - b) / busy.size();
        }
      }
      if (done % c.train.log_every == 0 || done == c.train.steps || st.skipped) {
        // A wait the job rode out (a link back within the deadline, a peer stopped for a while): the longest since
        // the previous line, when it took more than a tenth of the deadline (the watchdog's own resolution).
        const std::string stalled = stall.seconds > c.dist.timeout_s / 10
                                        ? strf(" | stalled %.1f s in %s on group %s", stall.seconds, stall.op, stall.group)
                                        : "";
        stall = {};
        // A slow rank (a loaded node, a throttled CPU) costs every rank its work beyond the middle rank's: shown
        // when that is a quarter of the step or more (less is the noise of ranks sharing cores).
        const std::string straggler =
            slow.cost_s > dt / 4 ? strf(" | slowest rank %d@%s +%.0f ms", slow.rank,
                                         parallel::world_hosts()[slow.rank].c_str(), 1000 * slow.cost_s)
                                  : "";
        say("step %6d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | %.0f ms/step%s%s%s | ETA %s",
            done, c.train.steps, loss, lr, st.grad_norm, tok_s, 100 * mfu, 1000 * dt,
            pipelined ? strf(" | bubble %.0f%%", 100 * bubble).c_str() : "", straggler.c_str(), stalled.c_str(),
            format_duration(per_step * (c.train.steps - done)).c_str());
      }
      if (metrics_) {
        JsonLine line;
        line.add("step", static_cast<long long>(done))
            .add("loss", loss)
            .add("lr", lr)
            .add("grad_norm", st.grad_norm)
            .add("tokens_per_s", tok_s)
            .add("mfu", mfu)
            .add("step_s", dt)
            .add("data_s", data_wait)
            .add("compute_s", t_compute - t0 - data_wait)
            .add("comm_s", st.comm_seconds)
            .add("wait_max_s", wait.seconds)
            .add("slowest_rank", static_cast<long long>(slow.rank))
            .add("straggler_s", slow.cost_s)
            .add("optim_s", st.optim_seconds)
            .add("optim_background_s", st.background_seconds)
            .add("skipped", static_cast<long long>(st.skipped))
            .add("tokens", static_cast<long long>(done * tokens_per_step))
            .add("peak_host_bytes", static_cast<long long>(host_peak_rss_bytes()))
            .add("base_host_bytes", static_cast<long long>(base_host_bytes_))
            .add("comm_bytes", step_traffic());
        if (pipelined) line.add("bubble", bubble).add("stage_busy", busy);
        metrics_->write(line);
      }
      if (st.skipped) {
        warn("step %d: non-finite %s, update skipped (%d in a row, train.max_bad_steps %d)", done,
             std::isfinite(loss) ? "gradient norm" : "loss", ++bad_run, c.train.max_bad_steps);
        if (bad_run >= c.train.max_bad_steps) {
          const std::string dir = save();
          throw Error(strf("%d consecutive steps with a non-finite loss or gradient norm (steps %d-%d); %s holds "
                           "the weights from before them",
                           bad_run, done - bad_run + 1, done, dir.c_str()),
                      true);
        }
      } else {
        bad_run = 0;
      }
      if (parallel::agreed_stop_signal()) return stop_for_requeue();
      if (c.ckpt.every > 0 && done % c.ckpt.every == 0 && done != c.train.steps) checkpoint();
      if (c.train.eval_every > 0 && done % c.train.eval_every == 0 && done != c.train.steps && !evaluate(done))
        return stop_for_requeue();
    }
    if (!evaluate(c.train.steps)) return stop_for_requeue();
    checkpoint();
    const double elapsed = now_seconds() - start;
    say("done: %d steps in %s, %.0f tokens/s average", c.train.steps - first, format_duration(elapsed).c_str(),
        (c.train.steps - first) * tokens_per_step / elapsed);
    return 0;
  }

 private:
  const parallel::Pipeline& pipeline() const { return groups_.topology().pipelines()[place_.pipeline]; }

  // A communicator for each distinct set of ranks: a group that has the same members as another (the data group of
  // plain data parallelism is the world) shares its communicator, whose traffic counts for the group other than
  // the world (two groups of data, tensor and pipeline have the same members only when they have one).
  Communicator& communicator(parallel::Group kind, size_t index = 0) {
    const parallel::ProcessGroup& g = groups_.get(kind, static_cast<int>(index));
    std::unique_ptr<Communicator>& c = comms_[g.world_ranks()];
    const bool made = c == nullptr;
    if (made) c = parallel::make_communicator(g, device_, replica_.backend->stream(), cfg_.dist.nccl_timeout_s);
    if (made || kind != parallel::Group::World) c->count_into(&traffic_[static_cast<int>(kind)]);
    return *c;
  }

  // This rank's tensor traffic in the step so far, by group and operation (the non-zero ones); evaluations and
  // checkpoints between steps are not counted.
  nlohmann::ordered_json step_traffic() const {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (parallel::Group g : {parallel::Group::Data, parallel::Group::Tensor, parallel::Group::Pipeline}) {
      const Traffic& now = traffic_[static_cast<int>(g)];
      const Traffic& start = step_start_traffic_[static_cast<int>(g)];
      nlohmann::ordered_json ops = nlohmann::ordered_json::object();
      for (int op = 0; op < static_cast<int>(CommOp::kCount); op++)
        if (now.bytes[op] > start.bytes[op])
          ops[comm_op_name(static_cast<CommOp>(op))] = now.bytes[op] - start.bytes[op];
      if (!ops.empty()) out[parallel::group_name(g)] = std::move(ops);
    }
    return out;
  }

  void describe_layout() const {
    const parallel::Topology& topo = groups_.topology();
    const Config& c = cfg_;
    if (topo.world_size() == static_cast<int>(topo.pipelines().size())) {
      say("parallel: %d ranks x %d micro-batch x %d accumulation = %d sequences/step (data parallel)",
          world_.size, c.train.micro_batch, pipeline().micro_batches, c.train.global_batch);
      return;
    }
    say("parallel: %zu pipelines on %d ranks, %s schedule, %d sequences/step:", topo.pipelines().size(),
        world_.size, c.parallel.schedule.c_str(), c.train.global_batch);
    for (size_t p = 0; p < topo.pipelines().size(); p++) {
      const parallel::Pipeline& pl = topo.pipelines()[p];
      std::string stages;
      for (size_t s = 0; s < pl.stages.size(); s++)
        stages += strf("%s rank %d: %s", s ? " |" : "", topo.rank_of({static_cast<int>(p), static_cast<int>(s), 0}),
                       parallel::range_name(c.model, pl.stages[s]).c_str());
      say("  pipeline %zu (%s, %d micro-batches of %d):%s", p, pl.name.c_str(), pl.micro_batches,
          c.train.micro_batch, stages.c_str());
    }
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

  // After a stop signal that every rank saw (parallel::agreed_stop_signal): checkpoints the steps done since the
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
                                                         [] { return parallel::agreed_stop_signal() != 0; });
    replica_.backend->range_pop();
    if (!loss) return false;
    const double sum = *loss * (place_.tp_rank == 0);
    const double val = parallel::allreduce_sum(sum) /
                       (static_cast<double>(cfg_.train.eval_batches) * groups_.topology().pipelines().size());
    say("val    %6lld | val_loss %.4f", static_cast<long long>(step), val);
    if (metrics_) metrics_->write(JsonLine().add("step", static_cast<long long>(step)).add("val_loss", val));
    return true;
  }

  Config cfg_;
  parallel::WorldInfo world_;
  parallel::ProcessGroups groups_;
  parallel::Place place_;
  int stages_;
  parallel::Schedule schedule_;
  Device device_ = Device::Cpu;
  bool gather_thread_ = false;  // ZeRO-3's gathers run on a communication thread
  size_t base_host_bytes_ = 0;  // the process's resident memory before the model (MPI, libraries)
  FaultInjection faults_;
  int micro_total_ = 1;  // micro-batches per step over every pipeline
  size_t n_params_ = 0;
  double flops_per_token_ = 0;
  PeakFlops peak_;
  std::string tokenizer_;
  TrainState state_;
  int64_t first_step_ = 0, saved_step_ = 0;  // where this run started; the newest step in a checkpoint
  Replica replica_;  // backend, optimizers, program
  // After the replica, so destroyed before its backend: the backend's teardown waits on streams behind NCCL events (and
  // cudaFree on the whole device) with no deadline; a communicator finalizes within dist.nccl_timeout_s or aborts.
  std::map<std::vector<int>, std::unique_ptr<Communicator>> comms_;
  Traffic traffic_[4] = {}, step_start_traffic_[4] = {};  // by parallel::Group
  Communicator* world_comm_ = nullptr;
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<TrainLoader> loader_;
  std::unique_ptr<ValLoader> val_;
  std::unique_ptr<MetricsLog> metrics_;
};

}  // namespace

int train_main(const std::vector<std::string>& args) {
  Config cfg;
  if (!parse_config(args, "train", cfg)) return 0;
  // Compared before validation: a value that only some ranks refuse would leave the others waiting.
  parallel::check_same_text_everywhere(cfg.hash(), cfg.to_ini(), "the resolved config", ini_difference);
  parallel::validate(cfg, parallel::world().size);
  parallel::watch_waits(cfg.dist.timeout_s);
  const RunDirOwner owner(cfg.run.dir);
  say("# yuanlm train: resolved config\n%s", cfg.to_ini().c_str());
  return Trainer(cfg).run();
}

}  // namespace yuan
