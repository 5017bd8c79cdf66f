// `yuanlm plan`: what a deck asks of a machine, before it is submitted. `--modules` lists the model's modules
// with their parameters and training FLOPs per token (what pipeline templates cut, and what `auto:K` balances).
// Without it, the job's layout ([parallel], or data parallelism over --world ranks): every pipeline's stages and
// ranks, the memory of each rank, and the bubble its schedule leaves; with --nodes or --ranks-per-node, the nodes
// too (consecutive ranks filling each node, as launchers place them by default), each with its ranks and groups,
// and which groups cross a node boundary. Memory comes from the same plans the trainer allocates by
// (train/memory_plan.h plan_rank, which the trainer also builds from and checks before it allocates), for the
// device the deck asks for (cuda when built with it, for train.device=auto), with no device needed; the formulas
// are in docs/MEMORY.md. With --machine FILE (planner/machine.h), time too: --predict gives the step time,
// tokens/s, MFU and split of the deck's own layout on that machine (planner/step_model.h; optim.offload = auto
// resolved as the trainer resolves it), and --nodes N searches every layout that fits N of its nodes, the
// optimizer's state on the GPUs and on the host, and ranks them by predicted tokens/s (planner/search.h).
#include <boost/program_options.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "comm/watchdog.h"
#include "config/config.h"
#include "layout/elastic.h"
#include "layout/layout.h"
#include "layout/nodes.h"
#include "layout/schedule.h"
#include "planner/calibrate.h"
#include "planner/machine.h"
#include "planner/replan.h"
#include "planner/search.h"
#include "planner/step_model.h"
#include "program/program.h"
#include "run/commands.h"
#include "train/memory_plan.h"
#include "util/error.h"
#include "util/log.h"
#include "util/memory.h"

namespace yuan {

namespace po = boost::program_options;

namespace {

void print_modules(const GPTConfig& c) {
  const ParamLayout layout(c);
  const std::vector<double> flops = layout::module_flops(c);
  say("%6s  %-6s %14s %14s", "index", "module", "parameters", "FLOPs/token");
  for (const ModuleSpec& m : layout.modules())
    say("%6d  %-6s %14zu %14.4g", m.index, m.name.c_str(), m.numel, flops[m.index]);
  say("%6s  %-6s %14zu %14.4g   (FLOPs: forward and backward, 6 x parameters + 12 C T of attention per block; the "
      "tied classifier's 6 V C with ln_f)", "", "total", layout.total(), flops_per_token(c, layout.total()));
}

// The bubble of a pipeline of p stages running m micro-batches, as a share of the step: (p-1)/(m+p-1) for both
// GPipe and 1F1B, which differ in memory, not in idle time.
double bubble(int p, int m) { return static_cast<double>(p - 1) / (m + p - 1); }

// With `nodes` (a plan --nodes), JSON rows also carry the node of each of the stage's tensor ranks ("nodes") and
// whether its groups cross a node boundary ("crosses": {"tensor", "pipeline", "data"}).
void print_layout(const Config& c, int world, bool json, const layout::NodeMap* nodes) {
  const layout::Topology topo = layout::make_topology(c, world);
  const std::vector<layout::GroupSpan> spans = nodes ? layout::group_spans(topo, *nodes)
                                                       : std::vector<layout::GroupSpan>();
  const Device device = planned_device(parse_device(c.train.device, "train.device"));
  const layout::ScheduleKind kind = layout::parse_schedule(c.parallel.schedule);
  const int T = topo.tp_size();
  if (!json)
    say("layout: %zu pipeline%s on %d ranks, %s schedule, micro-batch %d, global batch %d, ZeRO stage %d, tp %d, "
        "memory planned for the %s backend%s",
        topo.pipelines().size(), topo.pipelines().size() == 1 ? "" : "s", topo.world_size(),
        layout::schedule_name(kind), c.train.micro_batch, c.train.global_batch, c.optim.zero.number(), T,
        device_name(device), c.train.recompute ? " with recompute" : "");
  const std::vector<layout::Pipeline>& pipelines = topo.pipelines();
  for (size_t p = 0, next = 0; p < pipelines.size(); p = next) {
    const layout::Pipeline& pl = pipelines[p];
    const int stages = static_cast<int>(pl.stages.size());
    // Pipelines made alike (data-parallel replicas) are shown once; JSON lists each.
    next = p + 1;
    while (!json && next < pipelines.size() && pipelines[next].stages == pl.stages &&
           pipelines[next].micro_batches == pl.micro_batches)
      next++;
    if (!json)
      say("\npipeline%s%s: %d stage%s, %d micro-batches per step, bubble %.1f%% ((p-1)/(m+p-1))",
          next - p == 1 ? strf(" %zu", p).c_str() : strf("s %zu-%zu, alike", p, next - 1).c_str(),
          pl.name.empty() ? "" : (" (" + pl.name + ")").c_str(), stages, stages == 1 ? "" : "s", pl.micro_batches,
          100 * bubble(stages, pl.micro_batches));
    for (int s = 0; s < stages; s++) {
      // Tensor ranks hold parts of the same sizes: the first speaks for them.
      const int rank = topo.rank_of({static_cast<int>(p), s, 0});
      const RankMemory m = plan_rank(c, topo, device, rank).memory;
      const layout::Schedule schedule(kind, s, stages, pl.micro_batches);
      const std::string ranks = T == 1 ? strf("rank %d", rank) : strf("ranks %d-%d", rank, rank + T - 1);
      if (json) {
        nlohmann::ordered_json j = {
            {"pipeline", p}, {"stage", s}, {"first_rank", rank}, {"tp_size", T}, {"params", m.params},
            {"device", device_name(device)},
            {"device_bytes", {{"weights", m.on_device.weights}, {"grads", m.on_device.grads},
                              {"activations", m.on_device.activations}, {"buffers", m.on_device.buffers},
                              {"total", m.on_device.total()}}},
            {"host_bytes", {{"optimizer", m.host.optimizer}, {"staging", m.host.staging}, {"data", m.data},
                            {"local_storage", m.local_storage},
                            {"total", m.host.optimizer + m.host.staging + m.data + m.local_storage}}},
            {"rank_bytes", m.total()}};
        if (nodes) {
          std::vector<int> on;
          for (int t = 0; t < T; t++) on.push_back(nodes->node[rank + t]);
          j["nodes"] = on;
          nlohmann::ordered_json crosses = {{"tensor", false}, {"pipeline", false}, {"data", false}};
          for (const layout::GroupSpan& g : spans)
            if (g.crosses() &&
                std::any_of(g.ranks.begin(), g.ranks.end(), [&](int r) { return r >= rank && r < rank + T; }))
              crosses[g.kind] = true;
          j["crosses"] = crosses;
        }
        std::printf("%s\n", j.dump().c_str());
        continue;
      }
      say("  stage %d, %s: %s", s, ranks.c_str(), layout::range_name(c.model, pl.stages[s]).c_str());
      say("      %zu parameters per tensor rank; %s %s: weights %s, grads %s, activations %s (%d micro-batch%s in "
          "flight), buffers %s", m.params, device_name(device), format_bytes(m.on_device.total()).c_str(),
          format_bytes(m.on_device.weights).c_str(), format_bytes(m.on_device.grads).c_str(),
          format_bytes(m.on_device.activations).c_str(), schedule.slots(), schedule.slots() == 1 ? "" : "es",
          format_bytes(m.on_device.buffers).c_str());
      say("      host optimizer %s, staging %s, data %s%s", format_bytes(m.host.optimizer).c_str(),
          format_bytes(m.host.staging).c_str(), format_bytes(m.data).c_str(),
          device == Device::Cpu ? strf("; the rank's host memory %s", format_bytes(m.total()).c_str()).c_str()
                                : "");
      if (m.local_storage > 0)
        say("      local checkpoints (ckpt.local_every): node-local storage %s (own + partner shards, two generations; "
            "in memory under /dev/shm, copied and received into with no buffer besides)",
            format_bytes(m.local_storage).c_str());
    }
  }
  if (!nodes) return;
  for (const std::string& w : layout::tensor_crossing_warnings(spans, *nodes, T)) warn("%s", w.c_str());
  if (json) return;
  std::vector<std::string> lines = layout::describe_nodes(*nodes, spans);
  for (const std::string& line : layout::describe_crossings(spans)) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); i++) say("%s%s", i == 0 ? "\n" : "", lines[i].c_str());
}

// The nodes of a plan of `world` ranks from --nodes and --ranks-per-node (0 when not given; not both 0): either
// follows from the other and the world, and together they must make the world. `source` says where the world
// comes from, for the error.
layout::NodeMap plan_nodes(int world, const char* source, int nodes, int per_node) {
  if (nodes > 0 && per_node > 0) {
    if (static_cast<long>(nodes) * per_node != world)
      throw Error(strf("plan: --nodes %d x --ranks-per-node %d = %ld ranks, but the job has %d (%s)", nodes, per_node,
                       static_cast<long>(nodes) * per_node, world, source),
                  true);
    return layout::NodeMap::blocks(nodes, per_node);
  }
  const int given = nodes > 0 ? nodes : per_node;
  if (world % given != 0)
    throw Error(strf("plan: the job's %d ranks (%s) do not divide over %s %d; give --nodes and --ranks-per-node "
                     "whose product is %d",
                     world, source, nodes > 0 ? "--nodes" : "--ranks-per-node", given, world),
                true);
  return nodes > 0 ? layout::NodeMap::blocks(nodes, world / nodes)
                   : layout::NodeMap::blocks(world / per_node, per_node);
}

nlohmann::ordered_json split_json(const planner::StepSplit& s) {
  return {{"compute", s.compute}, {"comm", s.comm}, {"bubble", s.bubble}, {"optimizer", s.optimizer}};
}

nlohmann::ordered_json prediction_json(const planner::Prediction& p, const std::vector<std::string>& overrides,
                                       int world, int per_node) {
  nlohmann::ordered_json j = {{"fits", p.fits}, {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s},
                              {"mfu", p.mfu}, {"split", split_json(p.split)}, {"offload", name_of(p.offload)},
                              {"device_bytes", p.device_bytes}, {"device_optimizer_bytes", p.device_optimizer_bytes},
                              {"host_bytes", p.host_bytes}, {"world", world}, {"ranks_per_node", per_node},
                              {"overrides", overrides}};
  if (!p.fits) j["short_of"] = p.short_of;
  return j;
}

// "12.3 ms (45%)" of the step.
std::string part(double s, double step) { return strf("%.4g ms (%.0f%%)", 1e3 * s, 100 * s / step); }

// The overrides as a command line: quoted where the shell would split them.
std::string command_line(const std::vector<std::string>& overrides) {
  std::string s;
  for (const std::string& o : overrides) {
    const bool plain = o.find_first_of(" |'") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? o : "'" + o + "'");
  }
  return s;
}

void print_prediction(const planner::Prediction& p) {
  say("predicted step %.4g s, %.4g tokens/s (1B tokens in %.3g h), MFU %.1f%%: compute %s, exposed communication "
      "%s, bubble %s, optimizer %s", p.step_s, p.tokens_per_s, 1e9 / p.tokens_per_s / 3600, 100 * p.mfu,
      part(p.split.compute, p.step_s).c_str(), part(p.split.comm, p.step_s).c_str(),
      part(p.split.bubble, p.step_s).c_str(), part(p.split.optimizer, p.step_s).c_str());
  const bool on_device = p.offload == Offload::None;
  const std::string state = on_device ? " (" + format_bytes(static_cast<size_t>(p.device_optimizer_bytes)) +
                                            " of it the optimizer state)"
                                      : "";
  say("memory: optimizer state on the %s (optim.offload = %s); fullest device %s%s, fullest node's host %s%s",
      on_device ? "device" : "host", name_of(p.offload), format_bytes(static_cast<size_t>(p.device_bytes)).c_str(),
      state.c_str(), format_bytes(static_cast<size_t>(p.host_bytes)).c_str(),
      p.fits ? "" : ("; does not fit: " + p.short_of).c_str());
}

// `plan DECK --machine FILE --nodes N`: the layouts ranked by predicted tokens/s, the best `top`, and why the
// strongest of the rejected were rejected; or an Error saying what is short when none fits.
void print_search(const Config& cfg, const planner::Machine& m, const std::string& file, int nodes, int per_node,
                  int top, bool json) {
  const planner::Search found = planner::search_layouts(cfg, nodes, per_node, m);
  const int world = nodes * per_node;
  if (found.fitting.empty()) {
    if (found.rejected.empty())
      throw Error(strf("plan: no layout of the deck runs on %d ranks (%d nodes x %d): train.global_batch %d must "
                       "split into micro-batches over the data-parallel pipelines, and the model (%d heads, vocab "
                       "%d) over the tensor ranks%s", world, nodes, per_node, cfg.train.global_batch, cfg.model.n_head,
                       cfg.model.vocab_size, found.refused == 0 ? "" : strf("; %d layouts were refused, the first "
                       "with: %s", found.refused, found.refusal.c_str()).c_str()), true);
    const planner::Candidate& closest = *std::min_element(
        found.rejected.begin(), found.rejected.end(),
        [](const planner::Candidate& a, const planner::Candidate& b) { return a.prediction.over < b.prediction.over; });
    throw Error(strf("plan: no layout of the deck fits %d node%s x %d ranks of %s (%s): the closest, %s, is short of "
                     "%s; more nodes, or a machine with more memory per device", nodes, nodes == 1 ? "" : "s",
                     per_node, m.name.c_str(),
                     file.c_str(), closest.layout.c_str(), closest.prediction.short_of.c_str()), true);
  }
  const int shown = std::min<int>(top, static_cast<int>(found.fitting.size()));
  // The strongest rejected: the fastest of them as if they fitted, and whether they would have beaten the winner.
  const int rejected = std::min<int>(3, static_cast<int>(found.rejected.size()));
  const bool faster = rejected > 0 &&
                      found.rejected.front().prediction.tokens_per_s > found.fitting.front().prediction.tokens_per_s;
  if (json) {
    for (int i = 0; i < shown; i++) {
      const planner::Candidate& c = found.fitting[i];
      nlohmann::ordered_json j = {{"rank", i + 1}, {"layout", c.layout}};
      j.update(prediction_json(c.prediction, c.overrides, world, per_node));
      std::printf("%s\n", j.dump().c_str());
    }
    for (int i = 0; i < rejected; i++) {
      const planner::Candidate& c = found.rejected[i];
      nlohmann::ordered_json j = {{"rank", nullptr}, {"layout", c.layout}};
      j.update(prediction_json(c.prediction, c.overrides, world, per_node));
      std::printf("%s\n", j.dump().c_str());
    }
    return;
  }
  say("machine: %s (%s), %d node%s x %d ranks; %zu layouts fit, %zu do not; the best %d by predicted tokens/s:",
      m.name.c_str(), file.c_str(), nodes, nodes == 1 ? "" : "s", per_node, found.fitting.size(),
      found.rejected.size(), shown);
  say("attention: %s", planner::attention_charge(cfg, m, file).why.c_str());
  for (int i = 0; i < shown; i++) {
    const planner::Candidate& c = found.fitting[i];
    say("\n%d. %s", i + 1, c.layout.c_str());
    print_prediction(c.prediction);
    say("run: mpirun -np %d yuanlm train DECK %s", world, command_line(c.overrides).c_str());
  }
  if (rejected > 0)
    say("\nthe strongest rejected (%s):", faster ? "the fastest would beat the best that fits"
                                                : "none would beat the best that fits");
  for (int i = 0; i < rejected; i++) {
    const planner::Candidate& c = found.rejected[i];
    say("  %s: would reach %.4g tokens/s, but %s", c.layout.c_str(), c.prediction.tokens_per_s,
        c.prediction.short_of.c_str());
  }
}

// `plan --replan`: the layout the job of `c` re-forms on `nodes` surviving nodes of `per_node` ranks after losing
// `lost` (layout/elastic.h), what changed and why, the overrides that make it, and the new layout as a plan shows
// it; --json: one object {"overrides", "world", "idle", "notes"} for jobs/train.sbatch. With a machine file, the
// rule's layout the step-time model says is fastest on it (planner/replan.h), with its predicted step ("step_s",
// "tokens_per_s" in the JSON); without, the rule's FLOPs model's.
int print_replan(const Config& c, int nodes, int per_node, const std::vector<int>& lost,
                 const std::string& machine_file, bool json) {
  if (nodes < 1 || per_node < 1)
    throw Error("plan --replan needs --nodes (the surviving nodes) and --ranks-per-node, both at least 1", true);
  layout::Replan r;
  planner::Prediction p;
  if (machine_file.empty()) {
    r = layout::replan(c, nodes, per_node, lost);
    r.notes.push_back("no --machine: the layout the FLOPs model picks (micro-batches shared by the slowest stage's "
                      "module FLOPs, the bubble counted), not timed");
  } else {
    const planner::Machine m = planner::read_machine(machine_file);
    const std::string attention = planner::attention_charge(c, m, machine_file).why;
    const planner::ReplanChoice choice = planner::best_replan(c, nodes, per_node, lost, m, machine_file);
    r = choice.replan;
    r.notes.push_back("attention: " + attention);
    p = choice.prediction;
  }
  if (json) {
    nlohmann::ordered_json j = {{"overrides", r.overrides}, {"world", r.world}, {"idle", r.idle}, {"notes", r.notes}};
    if (!machine_file.empty()) j.update({{"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s}});
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  for (const std::string& n : r.notes) say("%s", n.c_str());
  if (!machine_file.empty()) print_prediction(p);
  say("overrides:");
  for (const std::string& o : r.overrides) say("  %s", o.c_str());
  say("%s", "");
  print_layout(r.config, r.world, false, nullptr);
  return 0;
}

}  // namespace

int plan_main(const std::vector<std::string>& args) {
  po::options_description own("plan", kHelpWidth);
  bool modules = false;
  int world = 0, nodes = 0, per_node = 0;
  bool json = false, predict = false, replan = false, calibrate = false;
  std::string machine_file, out;
  int top = 5;
  std::vector<int> lost;
  own.add_options()("modules", po::bool_switch(&modules), "list the model's modules with parameters and FLOPs")(
      "json", po::bool_switch(&json), "the layout's memory as one JSON object per stage (for tools/)")(
      "world", po::value(&world),
      "ranks of a data-parallel job (decks without parallel.pipelines; pipelines imply their own)")(
      "nodes", po::value(&nodes),
      "nodes the job runs on, consecutive ranks filling each: prints each node's ranks and groups and which groups "
      "cross a node boundary (--nodes x --ranks-per-node must make the job's ranks)")(
      "ranks-per-node", po::value(&per_node), "ranks on each node (with --nodes, or instead of it)")(
      "machine", po::value(&machine_file),
      "a machine file (input/machines/*.ini): with --nodes, search the layouts that fit and rank them by predicted "
      "tokens/s; with --predict, predict the deck's own layout")(
      "predict", po::bool_switch(&predict),
      "with --machine: the step time, tokens/s, MFU and split of the deck's layout")(
      "top", po::value(&top), "with --machine --nodes: how many of the best layouts to print (5)")(
      "replan", po::bool_switch(&replan),
      "the layout the job re-forms on --nodes surviving nodes of --ranks-per-node ranks after a failure, with the "
      "overrides that make it (docs/CLUSTER.md); with --machine FILE, the one the step-time model says is fastest "
      "there")(
      "lost-node", po::value(&lost),
      "(repeatable, with --replan) a lost node's index among the job's nodes, 0-based in rank order; default: its "
      "last nodes")(
      "calibrate", po::bool_switch(&calibrate),
      "measure this machine (alone: the node; under mpirun: each node, and the MPI links inside and across nodes) "
      "and write the machine file --out, which --machine reads")(
      "out", po::value(&out), "the machine file --calibrate writes");
  Config cfg;
  po::variables_map vm;
  if (!parse_config(args, "plan", cfg, &own, &vm)) return 0;
  if (calibrate) {
    validate_dist(cfg);
    comm::watch_waits(cfg.dist.timeout_s);  // every wait of the measurement, the ping-pongs' included
    planner::calibrate(out);
    return 0;
  }
  if (vm.count("out")) throw Error("plan: --out names the machine file that --calibrate writes; add --calibrate", true);
  YUAN_CHECK(cfg.model.n_layer > 0 && cfg.model.n_embd > 0, "plan: the deck gives no model (model.n_layer, "
             "model.n_embd, ...); usage: yuanlm plan DECK [--modules] [--world N] [--nodes N] [--ranks-per-node G] "
             "[--machine FILE [--predict] [--top K]] [--replan [--lost-node K]] [--calibrate --out FILE] [--json]");
  if (replan) return print_replan(cfg, nodes, per_node, lost, machine_file, json);
  const bool by_nodes = vm.count("nodes") + vm.count("ranks-per-node") > 0;
  if (top < 1) throw Error(strf("plan: --top %d must be at least 1", top), true);
  YUAN_CHECK(!predict || !machine_file.empty(), "plan: --predict needs --machine FILE");
  planner::Machine machine;
  std::string attention;  // whose attention kernels the machine's steps are charged for
  if (!machine_file.empty()) {
    machine = planner::read_machine(machine_file);
    // Refused here, naming the file, before any layout is planned: model.attention = cudnn where it does not run.
    attention = planner::attention_charge(cfg, machine, machine_file).why;
  }
  if (!machine_file.empty() && !predict) {
    // The search places its own layouts: it needs the nodes, and the ranks on each (the machine's devices by
    // default).
    if (vm.count("world"))
      throw Error("plan: --machine searches layouts over --nodes N [--ranks-per-node G]; --world belongs with "
                  "--predict (the deck's own layout)", true);
    if (nodes < 1) throw Error("plan: --machine without --predict needs --nodes N (the nodes to plan for)", true);
    if (per_node < 1) per_node = machine.devices_per_node;
    if (!machine.cpu() && per_node > machine.devices_per_node)
      throw Error(strf("plan: --ranks-per-node %d, but a node of %s has %d devices (%d ranks too many)", per_node,
                       machine_file.c_str(), machine.devices_per_node, per_node - machine.devices_per_node), true);
    validate_model_data_train(cfg);
    print_search(cfg, machine, machine_file, nodes, per_node, top, json);
    return 0;
  }
  if (vm.count("nodes") && nodes < 1) throw Error(strf("plan: --nodes %d must be at least 1", nodes), true);
  if (vm.count("ranks-per-node") && per_node < 1)
    throw Error(strf("plan: --ranks-per-node %d must be at least 1", per_node), true);
  // A layout holds a place for every rank: beyond the largest machines, a typo would only exhaust memory.
  constexpr long kMaxWorld = 1 << 20;
  // Pipelines name their ranks; a data-parallel deck plans --world ranks, or --nodes x --ranks-per-node, one by
  // default.
  const char* source = "--world";
  long ranks = world;
  if (vm.count("world") == 0) {
    ranks = layout::layout_ranks(cfg);
    source = "the deck's pipelines";
    if (ranks == 0 && nodes > 0 && per_node > 0) {
      ranks = static_cast<long>(nodes) * per_node;
      source = "--nodes x --ranks-per-node";
    } else if (ranks == 0 && by_nodes) {
      throw Error("plan: a data-parallel deck (no parallel.pipelines) on nodes needs --world, or both --nodes and "
                  "--ranks-per-node", true);
    }
    ranks = std::max(ranks, 1L);
  }
  if (ranks < 1 || ranks > kMaxWorld)
    throw Error(strf("plan: %s %ld must be a number of ranks from 1 to %ld", source, ranks, kMaxWorld), true);
  world = static_cast<int>(ranks);
  const layout::NodeMap node_map = by_nodes ? plan_nodes(world, source, nodes, per_node) : layout::NodeMap();
  if (!json)
    say("model: %d layers x %d wide, %d heads, seq %d, vocab %d: %zu parameters, %.4g FLOPs/token",
        cfg.model.n_layer, cfg.model.n_embd, cfg.model.n_head, cfg.model.seq_len, cfg.model.vocab_size,
        ParamLayout(cfg.model).total(), flops_per_token(cfg.model, ParamLayout(cfg.model).total()));
  if (modules) {
    print_modules(cfg.model);
    return 0;
  }
  if (predict) {
    // The deck's own layout on the machine's device, its ranks filling nodes as given (one node's devices each by
    // default).
    cfg.train.device = machine.kind;
    const int rpn = by_nodes ? world / node_map.nodes() : std::min(machine.devices_per_node, world);
    const planner::Prediction p = planner::predict(cfg, world, rpn, machine);
    cfg.optim.offload = p.offload;  // auto as the prediction resolved it
    const std::vector<std::string> overrides = planner::layout_overrides(cfg, machine);
    if (json) {
      std::printf("%s\n", prediction_json(p, overrides, world, rpn).dump().c_str());
    } else {
      say("machine: %s (%s), %d ranks, %d per node; attention: %s", machine.name.c_str(), machine_file.c_str(),
          world, rpn, attention.c_str());
      print_prediction(p);
    }
    return 0;
  }
  layout::validate(cfg, world);
  print_layout(cfg, world, json, by_nodes ? &node_map : nullptr);
  return 0;
}

}  // namespace yuan
