#include "layout/elastic.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "layout/layout.h"
#include "layout/nodes.h"
#include "util/error.h"

namespace yuan::layout {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error("replan: " + msg, true); }

int largest_divisor_at_most(int n, int cap) {
  for (int d = std::min(n, cap); d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string ranks_text(int first, int count) {
  return count == 1 ? strf("rank %d", first) : strf("ranks %d-%d", first, first + count - 1);
}

// A micro-batch's modelled time through a pipeline: the FLOPs per token of its slowest stage, which sets the pace
// of every other stage once the pipeline is full.
double pace(const std::vector<double>& flops, const std::vector<ModuleRange>& stages) {
  double worst = 0;
  for (const ModuleRange& s : stages) {
    double cost = 0;
    for (int m = s.first; m < s.end; m++) cost += flops[m];
    worst = std::max(worst, cost);
  }
  return worst;
}

// Micro-batches per template (in the order of `names`) for pipelines that run `counts[t]` copies of template t of
// `stages[t]` stages at `paces[t]`, summing to `total`, that minimise the modelled step time, the slowest pipeline's
// (m + stages - 1) x pace (its bubble counted). Empty when no assignment of at least one each sums to `total`.
std::vector<int> share_micro_batches(const std::vector<int>& counts, const std::vector<int>& stages,
                                     const std::vector<double>& paces, int total) {
  const double inf = std::numeric_limits<double>::infinity();
  const size_t T = counts.size();
  // best[s]: the smallest step time of the templates so far running s micro-batches; pick[t][s]: template t's share.
  std::vector<double> best(total + 1, inf);
  std::vector<std::vector<int>> pick(T, std::vector<int>(total + 1, 0));
  best[0] = 0;
  for (size_t t = 0; t < T; t++) {
    std::vector<double> next(total + 1, inf);
    for (int s = 0; s <= total; s++) {
      if (best[s] == inf) continue;
      for (int m = 1; s + counts[t] * m <= total; m++) {
        const double v = std::max(best[s], (m + stages[t] - 1) * paces[t]);
        if (v < next[s + counts[t] * m]) next[s + counts[t] * m] = v, pick[t][s + counts[t] * m] = m;
      }
    }
    best = std::move(next);
  }
  if (best[total] == inf) return {};
  std::vector<int> out(T);
  for (size_t t = T, s = static_cast<size_t>(total); t-- > 0;) {
    out[t] = pick[t][s];
    s -= static_cast<size_t>(counts[t] * out[t]);
  }
  return out;
}

// The largest micro-batch count the sharing is tried with: the dynamic programme is quadratic in it.
constexpr int kMaxMicroBatches = 1 << 14;
// The most rebuild choices, and sharings per choice and micro-batch size, offered beside the FLOPs rule's own.
constexpr size_t kMaxRebuilds = 64, kMaxSharings = 64;

struct Slot {
  std::string name;                 // its template
  std::vector<ModuleRange> stages;  // empty: dropped
};

// The pipelines grouped by template (in order of first use): how many copies, their depth and modelled pace.
struct Groups {
  std::vector<std::string> names;
  std::vector<int> counts, stages;
  std::vector<double> paces;
};

Groups group(const std::vector<Slot>& pipelines, const std::vector<double>& flops) {
  Groups g;
  for (const Slot& p : pipelines) {
    const auto at = std::find(g.names.begin(), g.names.end(), p.name);
    if (at != g.names.end()) {
      g.counts[at - g.names.begin()]++;
      continue;
    }
    g.names.push_back(p.name);
    g.counts.push_back(1);
    g.stages.push_back(static_cast<int>(p.stages.size()));
    g.paces.push_back(pace(flops, p.stages));
  }
  return g;
}

struct Shared {
  int micro_batch = 0;
  std::vector<std::string> names;  // the templates used, in order of first use
  std::vector<int> micro;          // by template in `names`
};

// The micro-batch sizes the rule allows for `pipelines`: train.micro_batch where an exact sharing exists, else every
// divisor of the global batch below it with one, largest first (the FLOPs rule takes the first); with each, the
// FLOPs rule's sharing. Empty when none does.
std::vector<Shared> micro_batch_sizes(const Config& c, const Groups& g) {
  std::vector<Shared> out;
  const int batch = c.train.global_batch;
  for (int mb = std::min(c.train.micro_batch, batch); mb >= 1; mb--) {
    if (batch % mb != 0 || batch / mb > kMaxMicroBatches) continue;
    std::vector<int> micro = share_micro_batches(g.counts, g.stages, g.paces, batch / mb);
    if (micro.empty()) continue;
    out.push_back({mb, g.names, micro});
    if (mb == c.train.micro_batch) break;
  }
  return out;
}

// Further sharings of `total` micro-batches over `g` (at least one per pipeline, by template), besides `rule`'s:
// those nearest it (each template's share within a window around the rule's, the window narrower the more
// templates), nearest first, at most kMaxSharings. Far from the FLOPs optimum a sharing only idles pipelines.
void other_sharings(const Groups& g, int total, const std::vector<int>& rule, std::vector<std::vector<int>>* out) {
  const size_t T = g.counts.size();
  if (T < 2) return;  // one template: its share is the total over its copies
  // (2 window + 1)^(T - 1) shares are walked: at most about 4096.
  const int window = std::max(1, static_cast<int>((std::pow(4096.0, 1.0 / static_cast<double>(T - 1)) - 1) / 2));
  std::vector<std::pair<int, std::vector<int>>> found;  // distance (the largest change of a share), sharing
  // An odometer over the shares of the first T - 1 templates, the first the slowest digit; each share runs up from
  // max(1, rule - window) to rule + window while the micro-batches left hold it, and the last template takes
  // what is left when that is a whole share for each of its copies.
  std::vector<int> m(T), left(T);
  const auto lowest = [&](size_t t) { return std::max(1, rule[t] - window); };
  left[0] = total;
  m[0] = lowest(0);
  for (size_t t = 0;;) {
    if (t + 1 < T && m[t] <= rule[t] + window && g.counts[t] * m[t] < left[t]) {
      left[t + 1] = left[t] - g.counts[t] * m[t];
      if (++t + 1 < T) m[t] = lowest(t);
      continue;
    }
    if (t + 1 == T && left[t] >= g.counts[t] && left[t] % g.counts[t] == 0) {
      m[t] = left[t] / g.counts[t];
      int distance = 0;
      for (size_t i = 0; i < T; i++) distance = std::max(distance, std::abs(m[i] - rule[i]));
      if (m != rule) found.push_back({distance, m});
    }
    if (t == 0) break;
    m[--t]++;
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < found.size() && i < kMaxSharings; i++) out->push_back(found[i].second);
}

std::string template_text(const GPTConfig& model, const Slot& t) {
  std::vector<std::string> stages;
  for (const ModuleRange& s : t.stages) stages.push_back(range_name(model, s));
  return t.name + ": " + join(stages, " | ");
}

void data_parallel(const Config& c, int ranks, Replan* r) {
  const int tp = c.parallel.tp_size, batch = c.train.global_batch;
  const int replicas = largest_divisor_at_most(batch, ranks / tp);
  const int mb = largest_divisor_at_most(batch / replicas, c.train.micro_batch);
  r->world = replicas * tp;
  r->idle = ranks - r->world;
  r->config.train.micro_batch = mb;
  r->overrides.push_back(strf("--train.micro_batch=%d", mb));
  r->notes.push_back(strf("data parallelism: %d replica%s%s on %d ranks, micro-batch %d%s, %d per step each: global "
                          "batch %d kept", replicas, replicas == 1 ? "" : "s",
                          tp == 1 ? "" : strf(" of tp %d", tp).c_str(), r->world, mb,
                          mb == c.train.micro_batch ? "" : strf(" (was %d)", c.train.micro_batch).c_str(),
                          batch / replicas / mb, batch));
  if (r->idle > 0)
    r->notes.push_back(strf("%d rank%s left idle: train.global_batch %d does not divide over more than %d replicas "
                            "of the %d the survivors hold", r->idle, r->idle == 1 ? "" : "s", batch, replicas,
                            ranks / tp));
}

// The layout of `slots` (none dropped) with the micro-batches `shared`, on `ranks` survivors' ranks, into `r`.
void write_pipelines(const Config& c, int ranks, const std::vector<Slot>& slots, const Shared& shared,
                     const char* how, Replan* r) {
  const int tp = c.parallel.tp_size;
  std::vector<std::string> texts, names, micro;
  for (size_t t = 0; t < shared.names.size(); t++) {
    const Slot& s = *std::find_if(slots.begin(), slots.end(), [&](const Slot& x) { return x.name == shared.names[t]; });
    texts.push_back(template_text(c.model, s));
    micro.push_back(strf("%s:%d", s.name.c_str(), shared.micro[t]));
  }
  r->world = 0;
  for (const Slot& s : slots) {
    names.push_back(s.name);
    r->world += static_cast<int>(s.stages.size()) * tp;
  }
  r->idle = ranks - r->world;
  Config& n = r->config;
  n.train.micro_batch = shared.micro_batch;
  n.parallel.templates = texts;
  n.parallel.pipelines = join(names, ",");
  n.parallel.microbatches = join(micro, ",");
  r->overrides.push_back(strf("--train.micro_batch=%d", shared.micro_batch));
  for (const std::string& t : texts) r->overrides.push_back("--parallel.template=" + t);
  r->overrides.push_back("--parallel.pipelines=" + n.parallel.pipelines);
  r->overrides.push_back("--parallel.microbatches=" + n.parallel.microbatches);
  r->notes.push_back(strf("pipelines %s on %d ranks, micro-batches %s of %d sequences%s (%s): global batch %d kept",
                          n.parallel.pipelines.c_str(), r->world, n.parallel.microbatches.c_str(), shared.micro_batch,
                          shared.micro_batch == c.train.micro_batch ? ""
                                                                    : strf(" (was %d)", c.train.micro_batch).c_str(),
                          how, c.train.global_batch));
  if (r->idle > 0)
    r->notes.push_back(strf("%d rank%s left idle: no pipeline takes them", r->idle, r->idle == 1 ? "" : "s"));
}

// One way of rebuilding the hit pipelines: the pipelines left (none dropped) and a note per hit one.
struct Rebuild {
  std::vector<Slot> slots;
  std::vector<std::string> notes;
};

// The job's pipelines on the nodes it ran on, and which of them lost a rank with a lost node.
struct Hit {
  std::vector<Slot> slots;  // every pipeline, as it was
  std::vector<size_t> hit;  // the indices of those with a rank on a lost node
  int pool = 0;             // the survivors' ranks the pipelines not hit leave over: the hit ones are rebuilt on them
};

Hit hit_pipelines(const Topology& old, int nodes, int per_node, std::vector<int> lost, int tp) {
  if (lost.empty() && old.world_size() > nodes * per_node) {
    // Not told which went: the job's last nodes.
    const int had = (old.world_size() + per_node - 1) / per_node;
    for (int n = nodes; n < had; n++) lost.push_back(n);
  }
  const int had = nodes + static_cast<int>(lost.size());
  if (old.world_size() > had * per_node)
    fail(strf("the job's pipelines take %d ranks, more than the %d nodes x %d ranks it ran on (%d surviving + %zu "
              "lost)", old.world_size(), had, per_node, nodes, lost.size()));
  const NodeMap map = NodeMap::blocks(had, per_node);
  const std::set<int> gone(lost.begin(), lost.end());
  Hit h;
  h.pool = nodes * per_node;
  for (size_t p = 0; p < old.pipelines().size(); p++) {
    const Pipeline& pl = old.pipelines()[p];
    const int first = old.rank_of({static_cast<int>(p), 0, 0}), size = static_cast<int>(pl.stages.size()) * tp;
    bool hit = false;
    for (int rank = first; rank < first + size; rank++) hit = hit || gone.count(map.node[rank]);
    if (hit) h.hit.push_back(p);
    else h.pool -= size;
    h.slots.push_back({pl.name, pl.stages});
  }
  return h;
}

// The templates a hit pipeline may be rebuilt from: the deck's (the last given of a name winning), else auto:K.
class Templates {
 public:
  explicit Templates(const Config& c) : flops_(module_flops(c.model)), tp_(c.parallel.tp_size) {
    for (const std::string& text : c.parallel.templates) {
      PipelineTemplate t = parse_template(text, c.model);
      if (!declared_.count(t.name)) order_.push_back(t.name);
      declared_[t.name] = {t.name, t.stages};
    }
  }

  // Those for a hit pipeline that was `was`, with `left` ranks, most stages first: for each depth below its own, the
  // deck's template of that depth, else auto:K (FLOPs-balanced); a one-stage pipeline (a data-parallel replica)
  // again as it was, on ranks left idle before.
  std::vector<Slot> rebuilds(const Slot& was, int left) const {
    std::vector<Slot> options;
    const int had_stages = static_cast<int>(was.stages.size());
    if (had_stages == 1 && tp_ <= left) options.push_back(was);
    for (int k = std::min(had_stages - 1, left / tp_); k >= 1; k--) options.push_back(of_depth(k));
    return options;
  }

 private:
  Slot of_depth(int k) const {
    for (const std::string& name : order_)
      if (static_cast<int>(declared_.at(name).stages.size()) == k) return declared_.at(name);
    Slot rebuilt{strf("auto%d", k), balance(flops_, k, block_module(0))};
    while (declared_.count(rebuilt.name) && declared_.at(rebuilt.name).stages.size() != static_cast<size_t>(k))
      rebuilt.name += "x";
    return rebuilt;
  }

  std::map<std::string, Slot> declared_;  // by name
  std::vector<std::string> order_;        // the names, in the deck's order
  std::vector<double> flops_;
  int tp_;
};

// The rebuild that `pick` names: hit pipeline i takes options[i][pick[i]], or is dropped where pick[i] is
// options[i].size() (left[i]: the ranks there were for it); the pipelines dropped are left out.
Rebuild rebuild_of(const Topology& old, const Hit& h, const std::vector<std::vector<Slot>>& options,
                   const std::vector<size_t>& pick, const std::vector<int>& left, int tp) {
  Rebuild r{h.slots, {}};
  for (size_t i = 0; i < h.hit.size(); i++) {
    const size_t p = h.hit[i];
    const Slot& was = h.slots[p];
    const std::string what = strf("pipeline %zu (%s, %s)", p, was.name.c_str(),
                                  ranks_text(old.rank_of({static_cast<int>(p), 0, 0}),
                                             static_cast<int>(was.stages.size()) * tp).c_str());
    if (pick[i] < options[i].size()) {
      const Slot& rebuilt = options[i][pick[i]];
      r.slots[p] = rebuilt;
      r.notes.push_back(strf("%s had ranks on a lost node: re-formed from template %s (%zu stage%s)", what.c_str(),
                             rebuilt.name.c_str(), rebuilt.stages.size(), rebuilt.stages.size() == 1 ? "" : "s"));
      continue;
    }
    r.slots[p].stages.clear();
    r.notes.push_back(options[i].empty()
                          ? strf("%s had ranks on a lost node: dropped (%d rank%s left for it, a stage takes "
                                 "parallel.tp_size %d)", what.c_str(), left[i], left[i] == 1 ? "" : "s", tp)
                          : strf("%s had ranks on a lost node: dropped", what.c_str()));
  }
  r.slots.erase(std::remove_if(r.slots.begin(), r.slots.end(), [](const Slot& s) { return s.stages.empty(); }),
                r.slots.end());
  return r;
}

// The ways of rebuilding the hit pipelines (at most kMaxRebuilds), each hit pipeline taking each of its options in
// turn and then being dropped: an odometer whose first hit pipeline is the slowest digit, its options those the
// ranks that the earlier ones leave over hold. The first is the FLOPs rule's (the most stages the pool holds,
// dropped when none fits). Ways that leave no pipeline are skipped.
std::vector<Rebuild> rebuild_choices(const Topology& old, const Hit& h, const Templates& templates, int tp) {
  const size_t n = h.hit.size();
  std::vector<std::vector<Slot>> options(n);
  std::vector<size_t> pick(n);  // options[i].size(): dropped
  std::vector<int> left(n + 1);
  const auto taken = [&](size_t i) {
    return pick[i] < options[i].size() ? static_cast<int>(options[i][pick[i]].stages.size()) * tp : 0;
  };
  left[0] = h.pool;
  std::vector<Rebuild> choices;
  for (size_t i = 0; choices.size() < kMaxRebuilds;) {
    for (; i < n; i++) {  // the digits from i on start over from their first option
      options[i] = templates.rebuilds(h.slots[h.hit[i]], left[i]);
      pick[i] = 0;
      left[i + 1] = left[i] - taken(i);
    }
    Rebuild r = rebuild_of(old, h, options, pick, left, tp);
    if (!r.slots.empty()) choices.push_back(std::move(r));
    while (i > 0 && pick[i - 1] == options[i - 1].size()) i--;  // the last digit with an option left
    if (i == 0) break;
    pick[i - 1]++;
    left[i] = left[i - 1] - taken(i - 1);
  }
  return choices;
}

// Every layout of the pipelines rule (the header's) on the survivors, appended to `out` from `base` (the notes so
// far): the FLOPs rule's own first (each hit pipeline rebuilt with the most stages the ranks left over hold, in
// order, the micro-batches shared by modelled throughput), then the other rebuilds (fewer stages, or dropped) and
// the other sharings of the micro-batches, and other micro-batch sizes where the deck's has no sharing.
void pipelines(const Config& c, int nodes, int per_node, const std::vector<int>& lost, const Replan& base,
               std::vector<Replan>* out) {
  const int tp = c.parallel.tp_size;
  const Topology old = make_topology(c, layout_ranks(c));
  const Hit h = hit_pipelines(old, nodes, per_node, lost, tp);
  std::vector<Rebuild> choices = rebuild_choices(old, h, Templates(c), tp);
  // At least one pipeline is left in the first choice: with every one hit, the pool is all the survivors' ranks.
  YUAN_CHECK(!choices.empty(), "replan: no pipeline left on %d ranks", nodes * per_node);

  const std::vector<double> flops = module_flops(c.model);
  for (size_t i = 0; i < choices.size(); i++) {
    Rebuild& choice = choices[i];
    // The global batch over the pipelines; where no exact sharing exists, the last pipeline goes idle, and so on.
    std::vector<Shared> sizes = micro_batch_sizes(c, group(choice.slots, flops));
    while (sizes.empty() && choice.slots.size() > 1) {
      choice.notes.push_back(strf("pipeline (%s) dropped: train.global_batch %d does not share over the pipelines "
                                  "with it", choice.slots.back().name.c_str(), c.train.global_batch));
      choice.slots.pop_back();
      sizes = micro_batch_sizes(c, group(choice.slots, flops));
    }
    if (sizes.empty()) {
      YUAN_CHECK(i > 0, "replan: no sharing of global batch %d over one pipeline", c.train.global_batch);
      continue;
    }
    const Groups g = group(choice.slots, flops);
    for (const Shared& size : sizes) {
      Replan r = base;
      r.notes.insert(r.notes.end(), choice.notes.begin(), choice.notes.end());
      Replan rule = r;
      write_pipelines(c, nodes * per_node, choice.slots, size, "shared by modelled throughput", &rule);
      out->push_back(rule);
      std::vector<std::vector<int>> others;
      other_sharings(g, c.train.global_batch / size.micro_batch, size.micro, &others);
      for (const std::vector<int>& micro : others) {
        Replan other = r;
        write_pipelines(c, nodes * per_node, choice.slots, {size.micro_batch, g.names, micro}, "another sharing",
                        &other);
        out->push_back(other);
      }
    }
  }
}

}  // namespace

std::vector<Replan> replan_candidates(const Config& c, int nodes, int ranks_per_node,
                                      const std::vector<int>& lost_nodes) {
  if (nodes < 1) fail("no node survived");
  if (ranks_per_node < 1) fail(strf("%d ranks per node", ranks_per_node));
  const int tp = c.parallel.tp_size;
  if (tp < 1) fail(strf("parallel.tp_size must be at least 1 (got %d)", tp));
  if (ranks_per_node % tp != 0)
    fail(strf("parallel.tp_size = %d does not divide the %d ranks per node: tensor groups must stay inside a node",
              tp, ranks_per_node));
  const int had = nodes + static_cast<int>(lost_nodes.size());
  std::vector<std::string> gone;
  for (int n : lost_nodes) {
    if (n < 0 || n >= had)
      fail(strf("lost node %d is not one of the job's %d nodes (0 to %d)", n, had, had - 1));
    gone.push_back(strf("%d", n));
  }
  if (std::set<int>(lost_nodes.begin(), lost_nodes.end()).size() != lost_nodes.size())
    fail(strf("lost node named twice in %s", join(gone, ",").c_str()));
  Replan base;
  base.config = c;
  base.notes.push_back(strf("replan: %d node%s of %d rank%s survive%s%s: %d ranks", nodes, nodes == 1 ? "" : "s",
                            ranks_per_node, ranks_per_node == 1 ? "" : "s", nodes == 1 ? "s" : "",
                            gone.empty() ? "" : strf(" (lost: node %s of %d)", join(gone, ", ").c_str(), had).c_str(),
                            nodes * ranks_per_node));
  std::vector<Replan> all;
  if (layout_ranks(c) == 0) {
    all.push_back(base);
    data_parallel(c, nodes * ranks_per_node, &all.back());
  } else {
    pipelines(c, nodes, ranks_per_node, lost_nodes, base, &all);
  }
  // The overrides make a job every rank accepts: the checks of a run, on the new world. The rule's own layout must
  // pass them (its Error says why not); another that does not is no candidate, nor one that repeats an earlier
  // layout (dropping pipeline 1 and rebuilding 2 is rebuilding 1 and dropping 2 when both take the same template).
  validate(all.front().config, all.front().world);
  std::vector<Replan> out{all.front()};
  std::set<std::vector<std::string>> seen{all.front().overrides};
  for (size_t i = 1; i < all.size(); i++) {
    if (!seen.insert(all[i].overrides).second) continue;
    try {
      validate(all[i].config, all[i].world);
      out.push_back(all[i]);
    } catch (const Error&) {
    }
  }
  return out;
}

Replan replan(const Config& c, int nodes, int ranks_per_node, const std::vector<int>& lost_nodes,
              const FitCheck& fits) {
  Replan r = replan_candidates(c, nodes, ranks_per_node, lost_nodes).front();
  if (fits) {
    const std::string why = fits(r.config, r.world);
    if (!why.empty())
      fail(strf("the %d surviving node%s cannot hold the job on %d ranks: %s", nodes, nodes == 1 ? "" : "s", r.world,
                why.c_str()));
  }
  return r;
}

}  // namespace yuan::layout
