#include "layout/layout.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>

#include "backend/backend.h"
#include "util/error.h"

namespace yuan::layout {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); i++)
    if (i == s.size() || s[i] == sep) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  return out;
}

bool parse_int(const std::string& s, int* out) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

[[noreturn]] void fail(const std::string& msg) { throw Error(msg, true); }

// A key's value as an error message shows it.
const char* shown(const std::string& value) { return value.empty() ? "(empty)" : value.c_str(); }

// A module's index from its name; -1 when the text names none of the model's modules.
int module_index(const GPTConfig& c, const std::string& name) {
  if (name == "wte") return kWteModule;
  if (name == "wpe") return kWpeModule;
  if (name == "ln_f") return ln_f_module(c);
  int layer = -1;
  if (name.rfind("h.", 0) == 0 && parse_int(name.substr(2), &layer) && layer >= 0 && layer < c.n_layer)
    return block_module(layer);
  return -1;
}

std::string model_modules(const GPTConfig& c) {
  return strf("the model has wte, wpe, %s, ln_f", range_name(c, {block_module(0), ln_f_module(c)}).c_str());
}

// The modules of one stage's text, in the order written.
std::vector<int> stage_modules(const std::string& text, const GPTConfig& c, const std::string& where) {
  std::vector<int> out;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) fail(strf("%s: an empty item in stage '%s'", where.c_str(), text.c_str()));
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      const int m = module_index(c, item);
      if (m < 0) fail(strf("%s: '%s' is not a module (%s)", where.c_str(), item.c_str(), model_modules(c).c_str()));
      out.push_back(m);
      continue;
    }
    const std::string a = trim(item.substr(0, dash)), b = trim(item.substr(dash + 1));
    const int first = module_index(c, a), last = module_index(c, b);
    if (first < block_module(0) || first >= ln_f_module(c) || last < block_module(0) || last >= ln_f_module(c) ||
        last < first)
      fail(strf("%s: '%s' is not a range of blocks h.A-h.B with A <= B (%s)", where.c_str(), item.c_str(),
                model_modules(c).c_str()));
    for (int m = first; m <= last; m++) out.push_back(m);
  }
  return out;
}

}  // namespace

std::string module_name(const GPTConfig& c, int m) {
  if (m == kWteModule) return "wte";
  if (m == kWpeModule) return "wpe";
  if (m == ln_f_module(c)) return "ln_f";
  return strf("h.%d", m - block_module(0));
}

std::string range_name(const GPTConfig& c, const ModuleRange& r) {
  std::string out;
  for (int m = r.first; m < r.end; m++) {
    std::string part = module_name(c, m);
    const int blocks_end = std::min(r.end, ln_f_module(c));
    if (m >= block_module(0) && blocks_end - m > 1) {  // a run of blocks as h.A-h.B
      part += "-" + module_name(c, blocks_end - 1);
      m = blocks_end - 1;
    }
    out += (out.empty() ? "" : ", ") + part;
  }
  return out;
}

std::vector<double> module_flops(const GPTConfig& c) {
  const ParamLayout layout(c);
  const double C = c.n_embd, T = c.seq_len, V = c.vocab_size;
  std::vector<double> f(static_cast<size_t>(module_count(c)), 0.0);
  for (const ModuleSpec& m : layout.modules()) {
    if (m.index == kWteModule || m.index == kWpeModule) continue;  // lookups
    f[m.index] = 6.0 * static_cast<double>(m.numel);
    if (m.index == ln_f_module(c)) f[m.index] += 6.0 * V * C;  // the tied classifier runs with ln_f
    else f[m.index] += 12.0 * C * T;                            // attention scores and values
  }
  return f;
}

std::vector<ModuleRange> balance(const std::vector<double>& cost, int stages, int first_cut) {
  const int n = static_cast<int>(cost.size());
  YUAN_CHECK(stages >= 1 && first_cut >= 1 && stages - 1 <= n - first_cut,
             "balance: %d stages of %d modules with cuts from module %d", stages, n, first_cut);
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
  // best[k][e]: the smallest largest stage cost of modules [0, e) in k stages; cut[k][e] where the last one starts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  for (int e = first_cut; e <= n; e++) best[1][e] = prefix[e];
  for (int k = 2; k <= stages; k++)
    for (int e = first_cut + k - 1; e <= n; e++)
      for (int s = first_cut + k - 2; s < e; s++) {
        const double v = std::max(best[k - 1][s], prefix[e] - prefix[s]);
        if (v < best[k][e]) best[k][e] = v, cut[k][e] = s;
      }
  std::vector<ModuleRange> out(stages);
  for (int k = stages, e = n; k >= 1; k--) {
    const int s = k == 1 ? 0 : cut[k][e];
    out[k - 1] = {s, e};
    e = s;
  }
  return out;
}

PipelineTemplate parse_template(const std::string& text, const GPTConfig& c) {
  const size_t colon = text.find(':');
  PipelineTemplate t;
  t.name = trim(text.substr(0, colon));
  const std::string where = strf("parallel.template %s", t.name.c_str());
  if (colon == std::string::npos || t.name.empty())
    fail(strf("parallel.template '%s': expected NAME: stage | stage | ... or NAME: auto:K", text.c_str()));
  const std::string body = trim(text.substr(colon + 1));
  const int n = module_count(c);
  if (body.rfind("auto:", 0) == 0) {
    int k = 0;
    // The stage cut after wpe at the earliest: the first stage embeds with both tables.
    const int most = n - block_module(0) + 1;
    if (!parse_int(trim(body.substr(5)), &k) || k < 1 || k > most)
      fail(strf("%s: '%s' needs a number of stages from 1 to %d (the model has %d blocks)", where.c_str(),
                body.c_str(), most, c.n_layer));
    t.stages = balance(module_flops(c), k, block_module(0));
    return t;
  }
  const std::vector<std::string> stages = split(body, '|');
  std::vector<std::vector<int>> mods;
  for (size_t s = 0; s < stages.size(); s++) {
    if (stages[s].empty()) fail(strf("%s: stage %zu is empty", where.c_str(), s + 1));
    mods.push_back(stage_modules(stages[s], c, where));
  }
  auto has = [](const std::vector<int>& v, int m) { return std::find(v.begin(), v.end(), m) != v.end(); };
  if (!has(mods.front(), kWteModule) || !has(mods.front(), kWpeModule))
    fail(strf("%s: The first stage must contain wte and wpe (it holds %s)", where.c_str(), stages.front().c_str()));
  if (!has(mods.back(), ln_f_module(c)))
    fail(strf("%s: The last stage must contain ln_f, with the tied output embedding (it holds %s)", where.c_str(),
              stages.back().c_str()));
  // Every module once, in model order, so that each stage is one contiguous range.
  const std::string mismatch = where + ": Modules in the pipeline template do not match the modules in the model";
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const std::vector<int>& stage : mods)
    for (int m : stage)
      if (seen[m]++) fail(strf("%s: %s appears twice", mismatch.c_str(), module_name(c, m).c_str()));
  for (int m = 0; m < n; m++)
    if (!seen[m]) fail(strf("%s: %s is missing (%s)", mismatch.c_str(), module_name(c, m).c_str(),
                            model_modules(c).c_str()));
  int next = 0;
  for (const std::vector<int>& stage : mods) {
    for (int m : stage) {
      if (m != next)
        fail(strf("%s: %s comes where %s should (%s, in this order)", mismatch.c_str(), module_name(c, m).c_str(),
                  module_name(c, next).c_str(), model_modules(c).c_str()));
      next++;
    }
    t.stages.push_back({next - static_cast<int>(stage.size()), next});
  }
  return t;
}

ScheduleKind parse_schedule(const std::string& text) {
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    if (text == schedule_name(k)) return k;
  fail(strf("parallel.schedule must be 1f1b or gpipe (got '%s')", text.c_str()));
}

namespace {

// The [parallel] pipelines with their micro-batches, checked against the model and the global batch; empty
// without pipelines.
std::vector<Pipeline> configured_pipelines(const Config& c) {
  const ParallelConfig& p = c.parallel;
  parse_schedule(p.schedule);
  if (p.tp_size < 1) fail(strf("parallel.tp_size must be at least 1 (got %d)", p.tp_size));
  if (p.tp_size > 1) check_tensor_parallel(c.model, p.tp_size);
  if (trim(p.pipelines).empty()) {
    // Without pipelines the micro-batches follow from the global batch: a count given here would be ignored.
    if (!trim(p.microbatches).empty())
      fail(strf("parallel.microbatches = %s needs parallel.pipelines (empty: data parallelism, one pipeline per "
                "rank, micro-batches from train.global_batch)", p.microbatches.c_str()));
    return {};
  }
  std::map<std::string, PipelineTemplate> templates;
  std::string names;
  for (const std::string& text : p.templates) {
    PipelineTemplate t = parse_template(text, c.model);
    names += (names.empty() ? "" : ", ") + t.name;
    templates[t.name] = std::move(t);
  }
  std::map<std::string, int> micro;
  if (!trim(p.microbatches).empty())
    for (const std::string& entry : split(p.microbatches, ',')) {
      const size_t colon = entry.find(':');
      int m = 0;
      const std::string name = trim(entry.substr(0, colon));
      if (colon == std::string::npos || !parse_int(trim(entry.substr(colon + 1)), &m) || m < 1)
        fail(strf("parallel.microbatches = %s: '%s' is not NAME:M with M >= 1", p.microbatches.c_str(),
                  entry.c_str()));
      if (!templates.count(name))
        fail(strf("parallel.microbatches = %s: unknown template '%s' (templates: %s)", p.microbatches.c_str(),
                  name.c_str(), names.empty() ? "none" : names.c_str()));
      if (!micro.emplace(name, m).second)
        fail(strf("parallel.microbatches = %s: template '%s' is given micro-batches twice", p.microbatches.c_str(),
                  name.c_str()));
    }
  std::vector<Pipeline> pipelines;
  long sequences = 0;
  for (const std::string& name : split(p.pipelines, ',')) {
    if (!templates.count(name))
      fail(strf("parallel.pipelines = %s: unknown template '%s' (templates: %s)", p.pipelines.c_str(), name.c_str(),
                names.empty() ? "none; define them with parallel.template" : names.c_str()));
    if (!micro.count(name))
      fail(strf("parallel.microbatches = %s: All pipelines must have a corresponding number of micro-batches: "
                "template %s has none", shown(p.microbatches), name.c_str()));
    pipelines.push_back({name, templates[name].stages, micro[name]});
    sequences += static_cast<long>(micro[name]) * c.train.micro_batch;
  }
  if (sequences != c.train.global_batch)
    fail(strf("parallel.microbatches = %s: the pipelines take %ld sequences per step (their micro-batches x "
              "train.micro_batch %d), train.global_batch is %d", p.microbatches.c_str(), sequences,
              c.train.micro_batch, c.train.global_batch));
  return pipelines;
}

}  // namespace

int layout_ranks(const Config& c) {
  int ranks = 0;
  for (const Pipeline& p : configured_pipelines(c)) ranks += static_cast<int>(p.stages.size()) * c.parallel.tp_size;
  return ranks;
}

Topology make_topology(const Config& c, int world) {
  const int n = module_count(c.model);
  std::vector<Pipeline> pipelines = configured_pipelines(c);
  const int tp = c.parallel.tp_size;
  if (pipelines.empty()) {
    // One one-stage pipeline per tp_size ranks: data parallelism over the replicas.
    if (world % tp != 0)
      fail(strf("parallel.tp_size = %d: the world size %d does not divide into replicas of %d ranks", tp, world, tp));
    const int replicas = world / tp;
    const long per_step = static_cast<long>(replicas) * c.train.micro_batch;
    if (c.train.global_batch % per_step != 0)
      fail(strf("train.global_batch (%d) must be divisible by %s (%d) x train.micro_batch (%d) = %ld",
                c.train.global_batch, tp == 1 ? "world size" : "the replicas (world size / parallel.tp_size)",
                replicas, c.train.micro_batch, per_step));
    return Topology::data_parallel(replicas, n, static_cast<int>(c.train.global_batch / per_step), tp);
  }
  long ranks = 0;
  std::string counted;
  for (const Pipeline& p : pipelines) {
    ranks += static_cast<long>(p.stages.size()) * c.parallel.tp_size;
    counted += strf("%s%zu", counted.empty() ? "" : " + ", p.stages.size());
  }
  if (ranks != world)
    fail(strf("parallel.pipelines = %s: Number of ranks in pipeline templates does not match world size: stages "
              "(%s) x tp_size %d = %ld, world size %d", c.parallel.pipelines.c_str(), counted.c_str(),
              c.parallel.tp_size, ranks, world));
  return Topology(std::move(pipelines), c.parallel.tp_size, n);
}

void validate(const Config& c, int world) {
  validate_model_data_train(c);
  const DeviceRequest device = parse_device(c.train.device, "train.device");
  validate_optim_run(c);
  if (!c.profile.kernels.empty() && (device.automatic || device.device != Device::Cuda))
    throw Error(strf("profile.kernels times GPU work with CUDA events: it needs train.device=cuda (got '%s')",
                     c.train.device.c_str()),
                true);
  // The [parallel] layout against the model, the batch and the world.
  const Topology topo = make_topology(c, world);
  for (const Pipeline& p : topo.pipelines())
    if (c.optim.zero.shards_weights() && p.stages.size() > 1)
      throw Error(strf("optim.zero = 3 needs one stage per pipeline (template '%s' has %zu): its gathers and "
                       "reductions in every pass would make stages of different pipelines wait on each other",
                       p.name.c_str(), p.stages.size()),
                  true);
}

}  // namespace yuan::layout
