// The training loop: every rank runs the same steps on its slice of the global batch.
//
//   for each step:  for each micro-batch: loader -> backend.forward_backward (ZeRO hook reduces buckets)
//                   optimizer.step: reduce/clip/AdamW on the shard/gather -> backend weights
//
// Gradients of micro-batch losses are scaled by 1/(world * accum) so that the sum over ranks and
// micro-batches is the gradient of the mean loss over the global batch, whatever the world size.
#include "train/train.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "backend/backend.h"
#include "config/config.h"
#include "data/loader.h"
#include "dist/communicator.h"
#include "dist/world.h"
#include "optim/schedule.h"
#include "optim/zero.h"
#include "train/metrics.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/peak.h"
#include "util/safetensors.h"

namespace yuan {
namespace {

class Trainer {
 public:
  explicit Trainer(const Config& cfg) : cfg_(cfg), world_(dist::world()) {
    const int T = cfg.model.seq_len;
    accum_ = cfg.train.global_batch / (world_.size * cfg.train.micro_batch);
    comm_ = make_mpi_communicator();
    backend_ = make_backend(cfg.train.device, cfg.model, cfg.train.micro_batch,
                            zero_padded_size(ParamLayout(cfg.model).total(), world_.size));
    const ParamLayout& layout = backend_->layout();
    n_params_ = layout.total();
    flops_per_token_ = flops_per_token(cfg.model, n_params_);
    {
      HostArray<float> init(n_params_, Mem::Params);
      init_gpt2(layout, cfg.train.seed, init.data());
      opt_ = std::make_unique<ZeroOptimizer>(cfg.optim, *backend_, *comm_, init.data());
    }
    LoaderSpec spec;
    spec.glob = cfg.data.train;
    spec.seq_len = T;
    spec.vocab_size = cfg.model.vocab_size;
    spec.seed = cfg.train.seed;
    spec.rank = world_.rank;
    spec.world = world_.size;
    spec.global_batch = cfg.train.global_batch;
    spec.micro_batch = cfg.train.micro_batch;
    spec.prefetch = cfg.data.prefetch;
    loader_ = std::make_unique<TrainLoader>(spec, 0);
    if (!cfg.data.val.empty()) {
      spec.glob = cfg.data.val;
      val_ = std::make_unique<ValLoader>(spec, cfg.train.eval_batches);
    }
    peak_flops_ = measure_peak_flops();
    // Test hook: YUANLM_FAIL_AT=RANK:STEP makes that rank throw at that step (tests/mpi/test_fail_*.sh).
    if (const char* f = std::getenv("YUANLM_FAIL_AT")) std::sscanf(f, "%d:%d", &fail_rank_, &fail_step_);
    if (world_.rank == 0) {
      make_dirs(cfg.run.dir);
      write_file_atomic(cfg.run.dir + "/config.ini", cfg.to_ini());
      metrics_ = std::make_unique<MetricsLog>(cfg.run.dir + "/metrics.jsonl");
    }
  }

  void run() {
    const Config& c = cfg_;
    say("model: %zu parameters (%.1fM), %.3g FLOPs/token (6N + 12LCT), %d layers x %d heads x %d, seq %d, vocab %d",
        n_params_, n_params_ / 1e6, flops_per_token_, c.model.n_layer, c.model.n_head, c.model.n_embd,
        c.model.seq_len, c.model.vocab_size);
    say("parallel: %d ranks x %d micro-batch x %d accumulation = %d sequences/step, ZeRO stage %d, backend %s",
        world_.size, c.train.micro_batch, accum_, c.train.global_batch, opt_->stage(), backend_->name());
    say("val: %s", val_ ? strf("%d micro-batches per rank from %s", val_->batches(), c.data.val.c_str()).c_str()
                        : "none (data.val is empty)");
    say("host memory per rank: params %s, grads %s, optimizer %s, activations %s; peak %.1f GFLOP/s per rank "
        "(measured FMA loop)",
        format_bytes(mem_bytes(Mem::Params)).c_str(), format_bytes(mem_bytes(Mem::Grads)).c_str(),
        format_bytes(mem_bytes(Mem::Optimizer)).c_str(), format_bytes(mem_bytes(Mem::Activations)).c_str(),
        peak_flops_ / 1e9);

    evaluate(0);
    const double tokens_per_step = static_cast<double>(c.train.global_batch) * c.model.seq_len;
    const double start = now_seconds();
    double timed = 0;  // seconds of steps after the first, which pays for warm-up
    for (int step = 0; step < c.train.steps; step++) {
      const double t0 = now_seconds(), wait0 = loader_->wait_seconds();
      const double lr = lr_at(c.optim, step, c.train.steps);
      YUAN_CHECK(!(world_.rank == fail_rank_ && step == fail_step_), "injected failure at step %d (YUANLM_FAIL_AT)",
                 step);
      double loss = 0;
      for (int m = 0; m < accum_; m++) {
        const int32_t* tokens = loader_->next_micro_batch();
        loss += backend_->forward_backward(tokens, c.train.micro_batch, 1.0f / (world_.size * accum_),
                                           opt_->ready_hook());
        opt_->after_micro_batch();
      }
      const double t_compute = now_seconds();
      ZeroStepStats st = opt_->step(lr);
      loss = dist::allreduce_sum(loss) / (world_.size * accum_);
      const double t1 = now_seconds(), dt = t1 - t0;
      if (step > 0) timed += dt;
      const int done = step + 1;
      const double per_step = step > 0 ? timed / step : dt;
      const double tok_s = tokens_per_step / dt;
      const double mfu = tok_s * flops_per_token_ / (peak_flops_ * world_.size);
      const double data_s = loader_->wait_seconds() - wait0;
      if (done % c.train.log_every == 0 || done == c.train.steps)
        say("step %6d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | %.0f ms/step | ETA %s", done,
            c.train.steps, loss, lr, st.grad_norm, tok_s, 100 * mfu, 1000 * dt,
            format_duration(per_step * (c.train.steps - done)).c_str());
      if (metrics_)
        metrics_->write(JsonLine()
                            .add("step", static_cast<long long>(done))
                            .add("loss", loss)
                            .add("lr", lr)
                            .add("grad_norm", st.grad_norm)
                            .add("tokens_per_s", tok_s)
                            .add("mfu", mfu)
                            .add("step_s", dt)
                            .add("data_s", data_s)
                            .add("compute_s", t_compute - t0 - data_s)
                            .add("comm_s", st.comm_seconds)
                            .add("optim_s", st.optim_seconds)
                            .add("tokens", static_cast<long long>(done * tokens_per_step))
                            .add("peak_host_bytes", static_cast<long long>(host_peak_rss_bytes())));
      if (c.train.eval_every > 0 && done % c.train.eval_every == 0 && done != c.train.steps) evaluate(done);
    }
    evaluate(c.train.steps);
    say("done: %d steps in %s, %.0f tokens/s average", c.train.steps, format_duration(now_seconds() - start).c_str(),
        c.train.steps * tokens_per_step / (now_seconds() - start));
    save_weights(cfg_.run.dir + "/model.safetensors");
  }

 private:
  void evaluate(int step) {
    if (!val_) return;
    double sum = 0;
    for (int i = 0; i < val_->batches(); i++) sum += backend_->forward_loss(val_->batch(i), cfg_.train.micro_batch);
    double val = dist::allreduce_sum(sum) / (static_cast<double>(val_->batches()) * world_.size);
    say("val    %6d | val_loss %.4f", step, val);
    if (metrics_) metrics_->write(JsonLine().add("step", static_cast<long long>(step)).add("val_loss", val));
  }

  // The full fp32 weights as the backend holds them after the last all-gather, under the layout's names.
  void save_weights(const std::string& path) {
    if (world_.rank != 0) return;
    HostArray<float> w(n_params_, Mem::Params);
    backend_->get_params(w.data(), 0, n_params_);
    SafetensorsWriter out;
    for (const TensorSpec& t : backend_->layout().tensors()) out.add_f32(t.name, t.shape, w.data() + t.offset);
    out.set_metadata("format", "yuanlm");
    out.set_metadata("config", cfg_.to_ini());
    out.write(path);
    say("weights: %s", path.c_str());
  }

  Config cfg_;
  dist::WorldInfo world_;
  int accum_ = 1;
  int fail_rank_ = -1, fail_step_ = -1;
  size_t n_params_ = 0;
  double flops_per_token_ = 0, peak_flops_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ZeroOptimizer> opt_;
  std::unique_ptr<TrainLoader> loader_;
  std::unique_ptr<ValLoader> val_;
  std::unique_ptr<MetricsLog> metrics_;
};

}  // namespace

int train_main(const std::vector<std::string>& args) {
  Config cfg;
  if (!parse_config(args, "train", cfg)) return 0;
  validate(cfg, dist::world().size);
  dist::check_same_everywhere(cfg.hash(), "the resolved config");
  say("# yuanlm train: resolved config\n%s", cfg.to_ini().c_str());
  Trainer(cfg).run();
  return 0;
}

}  // namespace yuan
