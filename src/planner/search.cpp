#include "planner/search.h"

#include <algorithm>
#include <cmath>

#include "layout/schedule.h"
#include "model/gpt.h"
#include "util/error.h"

namespace yuan::planner {

std::vector<std::string> layout_overrides(const Config& c, const Machine& m) {
  const ParallelConfig& p = c.parallel;
  std::vector<std::string> o = {
      "--train.device=" + m.kind,
      strf("--train.micro_batch=%d", c.train.micro_batch),
      strf("--train.recompute=%s", c.train.recompute ? "true" : "false"),
      strf("--optim.zero=%d", c.optim.zero.number()),
      std::string("--optim.offload=") + name_of(c.optim.offload),
      strf("--parallel.tp_size=%d", p.tp_size),
      "--parallel.schedule=" + p.schedule,
  };
  for (const std::string& t : p.templates) o.push_back("--parallel.template=" + t);
  o.push_back("--parallel.pipelines=" + p.pipelines);
  o.push_back("--parallel.microbatches=" + p.microbatches);
  return o;
}

namespace {

// A pipeline shape: `count` pipelines of `stages` stages running `micro` micro-batches each.
struct Pipelines {
  int count, stages, micro;
};

std::string pipelines_text(const std::vector<Pipelines>& ps) {
  std::string s;
  for (const Pipelines& p : ps)
    s += strf("%s%d x %d stage%s (%d micro-batch%s)", s.empty() ? "" : " + ", p.count, p.stages,
              p.stages == 1 ? "" : "s", p.micro, p.micro == 1 ? "" : "es");
  return s;
}

// The deck with one layout applied: pipelines as auto:K templates (empty for plain data parallelism).
Config with_layout(const Config& deck, const Machine& m, int tp, const std::vector<Pipelines>& ps, int micro_batch,
                   ZeroStage zero, Offload offload, bool recompute, layout::ScheduleKind schedule) {
  Config c = deck;
  c.train.device = m.kind;
  c.train.micro_batch = micro_batch;
  c.train.recompute = recompute;
  c.optim.zero = zero;
  c.optim.offload = offload;
  c.parallel.tp_size = tp;
  c.parallel.schedule = layout::schedule_name(schedule);
  c.parallel.templates.clear();
  c.parallel.pipelines.clear();
  c.parallel.microbatches.clear();
  if (ps.size() == 1 && ps[0].stages == 1) return c;  // data parallelism: micro-batches follow from the batch
  for (const Pipelines& p : ps) {
    const std::string name = strf("p%d", p.stages);
    c.parallel.templates.push_back(strf("%s:auto:%d", name.c_str(), p.stages));
    for (int i = 0; i < p.count; i++) c.parallel.pipelines += (c.parallel.pipelines.empty() ? "" : ",") + name;
    c.parallel.microbatches += strf("%s%s:%d", c.parallel.microbatches.empty() ? "" : ",", name.c_str(), p.micro);
  }
  return c;
}

bool tensor_width_fits(const GPTConfig& g, int tp) {
  return g.n_head % tp == 0 && (4 * g.n_embd) % tp == 0 && g.vocab_size % tp == 0;
}

}  // namespace

Search search_layouts(const Config& deck, int nodes, int ranks_per_node, const Machine& m) {
  const int world = nodes * ranks_per_node, G = deck.train.global_batch;
  const GPTConfig& g = deck.model;
  // Stages: auto:K keeps wte and wpe together, so a pipeline has at most n_layer + 1 stages.
  const int max_stages = g.n_layer + 1;
  // Heterogeneous jobs mix pipelines of p and p + 1 stages (Oobleck's templates) for the shallow depths where
  // uneven node counts leave ranks over.
  constexpr int kMaxMixedStages = 8;
  // Micro-batches beyond this many sequences gain nothing a GEMM would notice, and only fill the list.
  constexpr int kMaxMicroBatch = 64;
  Search out;
  const auto consider = [&](int tp, const std::vector<Pipelines>& ps, int b) {
    const bool deep = std::any_of(ps.begin(), ps.end(), [](const Pipelines& p) { return p.stages > 1; });
    int replicas = 0;
    for (const Pipelines& p : ps) replicas += p.count;
    for (int number = 0; number <= ZeroStage::kHighest; number++) {
      const ZeroStage zero(number);
      if (zero.shards_weights() && deep) continue;  // validate(): ZeRO-3 needs one stage per pipeline
      if (zero.shards_optimizer_state() && replicas == 1 && !deep) continue;  // nothing to shard over
      // The optimizer state on the GPUs where the trainer can keep it there (cuda), else on the host; the memory
      // check (predict) rejects a device that cannot hold it, the host twin still standing.
      const std::vector<Offload> placements =
          !m.cpu() ? std::vector<Offload>{Offload::None, Offload::Host} : std::vector<Offload>{Offload::Host};
      for (Offload offload : placements)
        for (bool recompute : {false, true})
          for (layout::ScheduleKind schedule : {layout::ScheduleKind::OneFOneB, layout::ScheduleKind::GPipe}) {
            if (!deep && schedule == layout::ScheduleKind::GPipe) continue;  // one stage: the schedules are the same
            Candidate cand;
            cand.config = with_layout(deck, m, tp, ps, b, zero, offload, recompute, schedule);
            cand.world = world;
            cand.layout = strf("tp %d, %s, micro-batch %d, ZeRO %d, optimizer on the %s%s%s", tp,
                               pipelines_text(ps).c_str(), b, zero.number(),
                               offload == Offload::None ? "device" : "host", recompute ? ", recompute" : "",
                               deep ? strf(", %s", layout::schedule_name(schedule)).c_str() : "");
            cand.overrides = layout_overrides(cand.config, m);
            try {
              cand.prediction = predict(cand.config, world, ranks_per_node, m);
            } catch (const Error& e) {
              // A layout the trainer would refuse (the model's shape against the cut, the device's op constraints).
              if (out.refused++ == 0) out.refusal = e.what();
              continue;
            }
            (cand.prediction.fits ? out.fitting : out.rejected).push_back(std::move(cand));
          }
    }
  };
  for (int tp = 1; tp <= ranks_per_node; tp *= 2) {
    if (ranks_per_node % tp != 0 || !tensor_width_fits(g, tp)) continue;
    const int slots = world / tp;  // stage slots: pipelines x stages
    for (int b = 1; b <= std::min(G, kMaxMicroBatch); b *= 2) {
      if (G % b != 0) continue;
      const int micro = G / b;  // micro-batches per step over all pipelines
      for (int p = 1; p <= std::min(max_stages, slots); p++) {
        if (slots % p == 0 && micro % (slots / p) == 0) consider(tp, {{slots / p, p, micro / (slots / p)}}, b);
        if (p + 1 > std::min(kMaxMixedStages, max_stages)) continue;
        // The fewest deeper pipelines that fill the slots, the micro-batches split so that each pipeline's
        // schedule takes about as long (a pipeline of p stages runs a micro-batch in about 1/p of the time).
        for (int deeper = 1; deeper * (p + 1) < slots; deeper++) {
          if ((slots - deeper * (p + 1)) % p != 0) continue;
          const int shallow = (slots - deeper * (p + 1)) / p;
          int best_m1 = 0;
          double best = 0;
          for (int m1 = 1; shallow * m1 < micro; m1++) {
            if ((micro - shallow * m1) % deeper != 0) continue;
            const int m2 = (micro - shallow * m1) / deeper;
            const double off = std::fabs(std::log(static_cast<double>(m2) / m1 * p / (p + 1)));
            if (best_m1 == 0 || off < best) best_m1 = m1, best = off;
          }
          if (best_m1 > 0)
            consider(tp, {{shallow, p, best_m1}, {deeper, p + 1, (micro - shallow * best_m1) / deeper}}, b);
          break;
        }
      }
    }
  }
  // Layouts predicted alike (ZeRO 1 and 2 with the state on the device, both reducing once a step) keep the order
  // they were enumerated in, the lower ZeRO stage first, whatever else the search adds.
  const auto faster = [](const Candidate& a, const Candidate& b) {
    return a.prediction.tokens_per_s > b.prediction.tokens_per_s;
  };
  std::stable_sort(out.fitting.begin(), out.fitting.end(), faster);
  std::stable_sort(out.rejected.begin(), out.rejected.end(), faster);
  return out;
}

}  // namespace yuan::planner
