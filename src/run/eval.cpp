// `yuanlm eval`: the mean next-token loss of a checkpoint on a fixed set of validation windows. The set is
// ValLoader's (the first batches * micro_batch * world windows in file order). By default it is the set the
// trainer's val_loss was measured on, whatever the number of ranks eval runs on: the trainer's pipelines (its
// data-parallel ranks) each evaluated train.eval_batches micro-batches, so batches per rank =
// train.eval_batches * (the run's pipelines) / (eval's ranks).
#include <cmath>
#include <cstdio>
#include <optional>

#include "comm/world.h"
#include "data/loader.h"
#include "layout/layout.h"
#include "run/commands.h"
#include "train/metrics.h"
#include "train/train.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {

namespace po = boost::program_options;

int eval_main(const std::vector<std::string>& args) {
  std::string checkpoint, data, device = "auto";
  int batches = 0, micro_batch = 0;  // 0 until given: the run's
  bool json = false;
  po::options_description desc(
      "yuanlm eval: mean next-token loss of a checkpoint on validation windows\n\n"
      "usage: [mpirun -np N] yuanlm eval --checkpoint DIR [options]\n\noptions", kHelpWidth);
  desc.add_options()
      ("help,h", "print this help")
      ("checkpoint", po::value(&checkpoint)->required(),
       "a checkpoint directory (run/ckpt/step_N) or a run directory (its newest checkpoint)")
      ("data", po::value(&data)->default_value("", "the run's data.val"), "glob of the shards to evaluate on")
      ("batches", po::value(&batches)->notifier(at_least("eval", "--batches", 1)),
       "micro-batches per rank: the set is the first batches x micro-batch x ranks windows in file order (default: "
       "the trainer's val set)")
      ("micro-batch", po::value(&micro_batch)->notifier(at_least("eval", "--micro-batch", 1)),
       "windows per forward pass (default: the run's train.micro_batch)")
      ("device", po::value(&device)->default_value(device), "cpu | cuda | auto")
      ("json", po::bool_switch(&json),
       "end stdout with one JSON line: val_loss, perplexity, windows, tokens, checkpoint, step, data, ranks");
  if (!parse_command("eval", args, desc)) return 0;

  // Every option is checked against the checkpoint's small files before its shards (tens of GB for a large model) are
  // read and verified, which still happens before any loss is computed. Both steps are reading and checking on each
  // rank alone (no collective), refused together.
  const comm::WorldInfo& w = comm::world();
  CheckpointInfo info;
  std::optional<ValLoader> val;
  const bool own_data = !data.empty();
  comm::refuse_together([&] {
    info = read_checkpoint_info(checkpoint);
    const Config& c = info.cfg;
    if (!own_data) data = c.data.val;
    YUAN_CHECK(!data.empty(), "eval: no --data given and the run of checkpoint %s had no data.val", info.dir.c_str());
    check_tokenizer(info, data);
    if (micro_batch == 0) micro_batch = c.train.micro_batch;
    if (batches == 0) {
      const int readers = static_cast<int>(layout::make_topology(c, info.world).pipelines().size());
      const long long trainer_batches = static_cast<long long>(c.train.eval_batches) * readers;
      YUAN_CHECK(trainer_batches % w.size == 0,
                 "eval: the trainer's val set is %lld micro-batches (%d pipelines x train.eval_batches %d), which %d "
                 "ranks cannot split evenly; give --batches",
                 trainer_batches, readers, c.train.eval_batches, w.size);
      batches = static_cast<int>(trainer_batches / w.size);
    }

    LoaderSpec spec;
    spec.glob = data;
    spec.seq_len = c.model.seq_len;
    spec.vocab_size = c.model.vocab_size;
    spec.rank = w.rank;
    spec.world = w.size;
    spec.micro_batch = micro_batch;
    // The run's train.eval_batches cannot change any more: --batches is what a user can lower. The set is checked
    // against the data before the weights are read and the replica, whose memory grows with the micro-batch, is
    // planned and allocated.
    val.emplace(spec, batches, own_data ? "--data" : "data.val", "--batches", "--micro-batch");
  });
  const Config& c = info.cfg;
  CheckpointModel m;
  comm::refuse_together([&] { m = load_checkpoint_model(info); });
  Replica model = checkpoint_replica(m, device, micro_batch);

  const double t0 = now_seconds();
  double sum = 0;
  for (int i = 0; i < batches; i++) {
    sum += model.program->forward_loss(val->batch(i), micro_batch);
    // Collective, after each micro-batch: a large --batches must not hold off a batch system's stop signal.
    if (const int sig = comm::agreed_stop_signal()) {
      warn("eval: stopped by %s after %d of %d micro-batches: no result; exit %d", comm::signal_name(sig), i + 1,
           batches, kExitRequeue);
      return kExitRequeue;
    }
  }
  // Every micro-batch holds the same number of targets, so the mean of the means is the mean over all targets.
  const double loss = comm::allreduce_sum(sum) / (static_cast<double>(batches) * w.size);
  const long long windows = static_cast<long long>(batches) * micro_batch * w.size;
  const long long tokens = windows * c.model.seq_len;
  say("eval %s (step %lld): val_loss %.6f, perplexity %.4g over %lld windows (%lld tokens) of %s; %d rank%s, %.2f s",
      m.dir.c_str(), static_cast<long long>(m.step), loss, std::exp(loss), windows, tokens, data.c_str(), w.size,
      w.size == 1 ? "" : "s", now_seconds() - t0);
  if (json && w.rank == 0) {
    std::printf("%s\n", JsonLine()
                            .add("val_loss", loss)
                            .add("perplexity", std::exp(loss))
                            .add("windows", windows)
                            .add("tokens", tokens)
                            .add("seq_len", static_cast<long long>(c.model.seq_len))
                            .add("checkpoint", m.dir)
                            .add("step", static_cast<long long>(m.step))
                            .add("data", data)
                            .add("ranks", static_cast<long long>(w.size))
                            .str()
                            .c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace yuan
