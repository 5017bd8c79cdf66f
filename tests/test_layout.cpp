// The [parallel] section (layout/layout.h): pipeline templates parsed against the model, balanced stages, and
// every check of a job's layout with its message (the heterogeneous runner's wording where users know it).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "layout/layout.h"
#include "model/gpt.h"
#include "test_util.h"

namespace yuan::layout {
namespace {

const GPTConfig kModel{4, 2, 16, 8, 32};  // wte, wpe, h.0 .. h.3, ln_f: modules 0 .. 6

Config job(std::vector<std::string> templates, std::string pipelines, std::string micro, int global_batch = 8) {
  Config c;
  c.model = kModel;
  c.data.train = "shards/*.h5";
  c.train.micro_batch = 2;
  c.train.global_batch = global_batch;
  c.parallel.templates = std::move(templates);
  c.parallel.pipelines = std::move(pipelines);
  c.parallel.microbatches = std::move(micro);
  return c;
}

std::string layout_error(const Config& c, int world) {
  const std::string e = testing::error_of([&] { make_topology(c, world); });
  if (e.empty()) ADD_FAILURE() << "no error";
  return e;
}

TEST(PipelineTemplate, StagesOfModulesAndRanges) {
  const PipelineTemplate t = parse_template("two: wte, wpe, h.0-h.1 | h.2, h.3 , ln_f", kModel);
  EXPECT_EQ(t.name, "two");
  EXPECT_EQ(t.stages, (std::vector<ModuleRange>{{0, 4}, {4, 7}}));
  EXPECT_EQ(parse_template("one:wte,wpe,h.0-h.3,ln_f", kModel).stages, std::vector<ModuleRange>{(ModuleRange{0, 7})});
  EXPECT_EQ(range_name(kModel, {0, 7}), "wte, wpe, h.0-h.3, ln_f");
  EXPECT_EQ(range_name(kModel, {3, 4}), "h.1");
  EXPECT_EQ(range_name(kModel, {4, 7}), "h.2-h.3, ln_f");
}

TEST(PipelineTemplate, EveryMistakeIsNamed) {
  auto err = [](const std::string& text) { return testing::error_of([&] { parse_template(text, kModel); }); };
  const std::string mismatch = "Modules in the pipeline template do not match the modules in the model";
  EXPECT_NE(err("t: wte, wpe, h.0 | h.2-h.3, ln_f").find(mismatch + ": h.1 is missing"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.1 | h.1-h.3, ln_f").find(mismatch + ": h.1 appears twice"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.1, h.0 | h.2-h.3, ln_f").find(mismatch + ": h.1 comes where h.0 should"),
            std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.3 | ln_f, h.3").find(mismatch), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.2, ln_f").find(mismatch + ": h.3 is missing"), std::string::npos);
  EXPECT_NE(err("t: wpe, h.0 | wte, h.1-h.3, ln_f").find("The first stage must contain wte and wpe"),
            std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.3, ln_f | h.3").find("The last stage must contain ln_f"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0 || h.1-h.3, ln_f").find("stage 2 is empty"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.3, ln_f |").find("stage 2 is empty"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, h.0-h.4, ln_f").find("'h.0-h.4' is not a range"), std::string::npos);
  EXPECT_NE(err("t: wte, wpe, block3, ln_f").find("'block3' is not a module"), std::string::npos);
  EXPECT_NE(err("wte, wpe").find("expected NAME: stage"), std::string::npos);
  EXPECT_NE(err("t: auto:0").find("from 1 to 6"), std::string::npos);
  EXPECT_NE(err("t: auto:7").find("from 1 to 6"), std::string::npos);
  for (const std::string& e : {err("t: wte, wpe, h.0 | h.2-h.3, ln_f"), err("t: auto:9")})
    EXPECT_EQ(e.rfind("parallel.template t: ", 0), 0u) << e;
}

TEST(PipelineTemplate, AutoBalancesTheModelledCost) {
  const std::vector<double> f = module_flops(kModel);
  const double total = std::accumulate(f.begin(), f.end(), 0.0);
  EXPECT_DOUBLE_EQ(total, flops_per_token(kModel, ParamLayout(kModel).total()));
  for (int k = 1; k <= 6; k++) {
    const PipelineTemplate t = parse_template("a: auto:" + std::to_string(k), kModel);
    ASSERT_EQ(t.stages.size(), static_cast<size_t>(k));
    EXPECT_GE(t.stages[0].end, 2) << "wte and wpe stay together";
    // No other cut of the same number of stages has a smaller largest stage: compare with every cut.
    double worst = 0;
    for (const ModuleRange& s : t.stages) worst = std::max(worst, std::accumulate(f.begin() + s.first, f.begin() + s.end, 0.0));
    std::vector<ModuleRange> all;
    std::function<double(int, int)> best = [&](int from, int left) -> double {
      if (left == 1) return std::accumulate(f.begin() + from, f.end(), 0.0);
      double b = 1e300;
      for (int e = std::max(from + 1, 2); e + left - 1 <= 7; e++)
        b = std::min(b, std::max(std::accumulate(f.begin() + from, f.begin() + e, 0.0), best(e, left - 1)));
      return b;
    };
    EXPECT_DOUBLE_EQ(worst, best(0, k)) << k << " stages";
  }
  // The balance of a cost with one heavy module isolates it.
  EXPECT_EQ(balance({0, 0, 1, 1, 10, 1, 1}, 3, 2), (std::vector<ModuleRange>{{0, 4}, {4, 5}, {5, 7}}));
}

TEST(JobLayout, PipelinesTakeTheirMicroBatchesOfTheGlobalBatch) {
  const Topology t = make_topology(job({"one: auto:1", "two: wte, wpe, h.0 | h.1-h.3, ln_f"}, "one, two, two",
                                       "one:2, two:1"), 5);
  ASSERT_EQ(t.pipelines().size(), 3u);
  EXPECT_EQ(t.pipelines()[0].micro_batches, 2);
  EXPECT_EQ(t.pipelines()[2].micro_batches, 1);
  EXPECT_EQ(t.pipelines()[1].name, "two");
  EXPECT_EQ(t.world_size(), 5);
  // Without pipelines: data parallelism, the batch split evenly.
  const Topology dp = make_topology(job({}, "", ""), 2);
  EXPECT_EQ(dp.pipelines().size(), 2u);
  EXPECT_EQ(dp.pipelines()[0].micro_batches, 2);
}

// The pipelines read consecutive runs of micro-batches of the global batch, in pipeline order; both ends of a
// pipeline read the same run.
TEST(JobLayout, EachRankReadsItsPipelinesMicroBatches) {
  const Topology t = make_topology(job({"one: auto:1", "two: wte, wpe, h.0 | h.1-h.3, ln_f"}, "one, two, two",
                                       "one:2, two:1"), 5);
  std::vector<std::pair<int, int>> got;
  for (int rank = 0; rank < t.world_size(); rank++) {
    const MicroBatches m = t.micro_batches_of(rank);
    got.push_back({m.first, m.count});
  }
  EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{0, 2}, {2, 1}, {2, 1}, {3, 1}, {3, 1}}));
  const Topology dp = make_topology(job({}, "", ""), 2);
  EXPECT_EQ(dp.micro_batches_of(1).first, 2);
  EXPECT_EQ(dp.micro_batches_of(1).count, 2);
}

TEST(JobLayout, EveryMismatchIsNamedWithItsKey) {
  const std::vector<std::string> t = {"one: auto:1", "two: auto:2"};
  std::string e = layout_error(job(t, "one, two", "one:2, two:2"), 4);
  EXPECT_NE(e.find("parallel.pipelines = one, two: Number of ranks in pipeline templates does not match world "
                   "size: stages (1 + 2) x tp_size 1 = 3, world size 4"),
            std::string::npos)
      << e;
  e = layout_error(job(t, "one, two", "one:2"), 3);
  EXPECT_NE(e.find("parallel.microbatches = one:2: All pipelines must have a corresponding number of micro-batches: "
                   "template two has none"),
            std::string::npos)
      << e;
  e = layout_error(job(t, "one, three", "one:2"), 3);
  EXPECT_NE(e.find("parallel.pipelines = one, three: unknown template 'three' (templates: one, two)"),
            std::string::npos)
      << e;
  e = layout_error(job(t, "one, two", "one:2, two:1"), 3);
  EXPECT_NE(e.find("parallel.microbatches = one:2, two:1: the pipelines take 6 sequences per step"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("train.global_batch is 8"), std::string::npos) << e;
  e = layout_error(job(t, "one, two", "one:2, two:x"), 3);
  EXPECT_NE(e.find("'two:x' is not NAME:M"), std::string::npos) << e;
  e = layout_error(job(t, "one, two", "one:2, two:2, six:1"), 3);
  EXPECT_NE(e.find("unknown template 'six'"), std::string::npos) << e;
  e = layout_error(job(t, "one, two", "one:2, two:2, one:1"), 3);
  EXPECT_NE(e.find("parallel.microbatches = one:2, two:2, one:1: template 'one' is given micro-batches twice"),
            std::string::npos)
      << e;
  // Micro-batches without pipelines would be ignored: data parallelism takes them from the global batch.
  e = layout_error(job(t, "", "one:4"), 2);
  EXPECT_NE(e.find("parallel.microbatches = one:4 needs parallel.pipelines"), std::string::npos) << e;
  Config c = job(t, "one, two", "one:2, two:2");
  c.parallel.schedule = "zigzag";
  EXPECT_NE(layout_error(c, 3).find("parallel.schedule must be 1f1b or gpipe (got 'zigzag')"), std::string::npos);
  c.parallel.schedule = "gpipe";
  c.parallel.tp_size = 3;  // 2 heads of kModel do not split over 3
  EXPECT_NE(layout_error(c, 9).find("parallel.tp_size = 3: model.n_head (2) does not split over 3 tensor-parallel "
                                    "ranks"),
            std::string::npos);
  c.parallel.tp_size = 2;
  EXPECT_NE(layout_error(c, 8).find("world size 8"), std::string::npos) << "(1 + 2 stages) x 2 = 6 ranks";
  EXPECT_EQ(make_topology(c, 6).world_size(), 6);
  Config v = job({}, "", "");
  v.model.vocab_size = 31;
  v.parallel.tp_size = 2;
  EXPECT_NE(layout_error(v, 2).find("model.vocab_size (31) does not split over 2"), std::string::npos);
  v.model.vocab_size = 32;
  EXPECT_NE(layout_error(v, 3).find("the world size 3 does not divide into replicas of 2 ranks"), std::string::npos);
  EXPECT_EQ(make_topology(v, 4).pipelines().size(), 2u);
  // Errors are collective: every rank raises the same, so one reports it and none is left waiting.
  try {
    make_topology(job(t, "one, two", "one:2"), 3);
  } catch (const Error& err) {
    EXPECT_TRUE(err.collective());
  }
}

TEST(JobLayout, ConfigValidationRunsTheLayoutChecks) {
  Config c = job({"two: wte, wpe | h.0-h.3, ln_f"}, "two", "two:4");
  EXPECT_EQ(testing::error_of([&] { layout::validate(c, 2); }), "");
  EXPECT_NE(testing::error_of([&] { layout::validate(c, 3); }).find("does not match world size"),
            std::string::npos);
}

}  // namespace
}  // namespace yuan::layout
