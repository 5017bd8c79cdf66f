// `yuanlm plan`: what a deck asks of a machine, before it is submitted. `--modules` lists the model's modules
// with their parameters and training FLOPs per token (what pipeline templates cut, and what `auto:K` balances).
// Without it, the job's layout ([parallel], or data parallelism over --world ranks): every pipeline's stages and
// ranks, the memory of each rank, and the bubble its schedule leaves. Memory comes from the same plans the
// trainer allocates by (model/program.h plan_memory, optim/zero.h zero_optimizer_bytes), for the device the deck
// asks for (cuda when built with it, for train.device=auto), with no device needed.
#include <boost/program_options.hpp>
#include <algorithm>
#include <cstdio>
#include <optional>

#include "config/config.h"
#include "model/program.h"
#include "optim/zero.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "run/commands.h"
#include "train/metrics.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {

namespace po = boost::program_options;

namespace {

void print_modules(const GPTConfig& c) {
  const ParamLayout layout(c);
  const std::vector<double> flops = parallel::module_flops(c);
  say("%6s  %-6s %14s %14s", "index", "module", "parameters", "FLOPs/token");
  for (const ModuleSpec& m : layout.modules())
    say("%6d  %-6s %14zu %14.4g", m.index, m.name.c_str(), m.numel, flops[m.index]);
  say("%6s  %-6s %14zu %14.4g   (FLOPs: forward and backward, 6 x parameters + 12 C T of attention per block; the "
      "tied classifier's 6 V C with ln_f)", "", "total", layout.total(), flops_per_token(c, layout.total()));
}

// The bubble of a pipeline of p stages running m micro-batches, as a share of the step: (p-1)/(m+p-1) for both
// GPipe and 1F1B, which differ in memory, not in idle time.
double bubble(int p, int m) { return static_cast<double>(p - 1) / (m + p - 1); }

void print_layout(const Config& c, int world) {
  const parallel::Topology topo = parallel::make_topology(c, world);
  const Device device = planned_device(parse_device(c.train.device, "train.device"));
  const parallel::ScheduleKind kind = parallel::parse_schedule(c.parallel.schedule);
  say("layout: %zu pipeline%s on %d ranks, %s schedule, micro-batch %d, global batch %d, ZeRO stage %d, memory "
      "planned for the %s backend%s",
      topo.pipelines().size(), topo.pipelines().size() == 1 ? "" : "s", topo.world_size(),
      parallel::schedule_name(kind), c.train.micro_batch, c.train.global_batch, c.optim.zero, device_name(device),
      c.train.recompute ? " with recompute" : "");
  for (size_t p = 0; p < topo.pipelines().size(); p++) {
    const parallel::Pipeline& pl = topo.pipelines()[p];
    const int stages = static_cast<int>(pl.stages.size());
    say("\npipeline %zu%s: %d stage%s, %d micro-batches per step, bubble %.1f%% ((p-1)/(m+p-1))", p,
        pl.name.empty() ? "" : (" (" + pl.name + ")").c_str(), stages, stages == 1 ? "" : "s", pl.micro_batches,
        100 * bubble(stages, pl.micro_batches));
    for (int s = 0; s < stages; s++) {
      const int rank = topo.rank_of({static_cast<int>(p), s, 0});
      const ModuleRange& range = pl.stages[s];
      const ParamLayout held(c.model, held_modules(c.model, range), {0, topo.tp_size()});
      const parallel::Schedule schedule(kind, s, stages, pl.micro_batches);
      // Host optimizer state: this rank's shard of each module group it holds; ZeRO-3's shards on the device.
      size_t optimizer = 0;
      std::optional<size_t> shards;
      for (const ModuleRange& g : topo.module_groups_of(rank)) {
        const std::vector<int> holders = topo.holders(g.first, 0);
        const int group_rank = static_cast<int>(std::find(holders.begin(), holders.end(), rank) - holders.begin());
        const size_t shard =
            zero_shard_elements(held, g, static_cast<int>(holders.size()), group_rank, c.optim.zero);
        optimizer += zero_optimizer_bytes(shard, c.optim.delayed_update);
        if (c.optim.zero == 3) shards = shard;  // one module group (validate)
      }
      const MemoryPlan mem =
          plan_memory(device, c.model, {range, c.train.micro_batch, schedule.slots(), c.train.recompute,
                                        topo.tp_size()},
                      zero_param_memory(held, shards));
      say("  stage %d, rank %d: %s", s, rank, parallel::range_name(c.model, range).c_str());
      say("      %zu parameters; device %s (weights %s, grads %s, activations %s of %d micro-batch%s in flight, "
          "buffers %s); host optimizer %s",
          held.total(), format_bytes(mem.total()).c_str(), format_bytes(mem.weights).c_str(),
          format_bytes(mem.grads).c_str(), format_bytes(mem.activations).c_str(), schedule.slots(),
          schedule.slots() == 1 ? "" : "es", format_bytes(mem.buffers).c_str(), format_bytes(optimizer).c_str());
    }
  }
}

}  // namespace

int plan_main(const std::vector<std::string>& args) {
  po::options_description own("plan", kHelpWidth);
  bool modules = false;
  int world = 0;
  own.add_options()("modules", po::bool_switch(&modules), "list the model's modules with parameters and FLOPs")(
      "world", po::value(&world),
      "ranks of a data-parallel job (decks without parallel.pipelines; pipelines imply their own)");
  Config cfg;
  po::variables_map vm;
  if (!parse_config(args, "plan", cfg, &own, &vm)) return 0;
  YUAN_CHECK(cfg.model.n_layer > 0 && cfg.model.n_embd > 0, "plan: the deck gives no model (model.n_layer, "
             "model.n_embd, ...); usage: yuanlm plan DECK [--modules] [--world N]");
  say("model: %d layers x %d wide, %d heads, seq %d, vocab %d: %zu parameters, %.4g FLOPs/token", cfg.model.n_layer,
      cfg.model.n_embd, cfg.model.n_head, cfg.model.seq_len, cfg.model.vocab_size, ParamLayout(cfg.model).total(),
      flops_per_token(cfg.model, ParamLayout(cfg.model).total()));
  if (modules) {
    print_modules(cfg.model);
    return 0;
  }
  // Pipelines name their ranks; a data-parallel deck plans --world ranks, one by default.
  if (vm.count("world") == 0) world = std::max(1, parallel::layout_ranks(cfg));
  validate(cfg, world);
  print_layout(cfg, world);
  return 0;
}

}  // namespace yuan
