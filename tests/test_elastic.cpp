// The re-plan rule (layout/elastic.h): the layout a job re-forms on the nodes that survive, as overrides that keep
// the global batch, keep tensor groups inside nodes, and rebuild only the pipelines that lost a stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "layout/elastic.h"
#include "layout/layout.h"
#include "test_util.h"

namespace yuan::layout {
namespace {

const GPTConfig kModel{4, 2, 16, 8, 32};  // wte, wpe, h.0 .. h.3, ln_f: modules 0 .. 6

Config job(int global_batch, int micro_batch, int tp = 1) {
  Config c;
  c.model = kModel;
  c.data.train = "shards/*.h5";
  c.train.global_batch = global_batch;
  c.train.micro_batch = micro_batch;
  c.parallel.tp_size = tp;
  return c;
}

Config pipelined(std::vector<std::string> templates, std::string pipelines, std::string micro, int global_batch,
                 int micro_batch = 1) {
  Config c = job(global_batch, micro_batch);
  c.parallel.templates = std::move(templates);
  c.parallel.pipelines = std::move(pipelines);
  c.parallel.microbatches = std::move(micro);
  return c;
}

const std::string kOne = "one: wte, wpe, h.0-h.3, ln_f";
const std::string kTwo = "two: wte, wpe, h.0-h.1 | h.2-h.3, ln_f";

// The sequences per step of a re-planned job: every pipeline's micro-batches x the micro-batch.
long sequences(const Replan& r) {
  const Topology t = make_topology(r.config, r.world);
  long n = 0;
  for (const Pipeline& p : t.pipelines()) n += static_cast<long>(p.micro_batches) * r.config.train.micro_batch;
  return n;
}

bool says(const Replan& r, const std::string& text) {
  for (const std::string& n : r.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

TEST(Elastic, DataParallelTakesEverySurvivorTheGlobalBatchDividesOver) {
  // 4 nodes x 2 ranks, global batch 12 of micro-batch 2 (3 per rank at 4 ranks): one node lost leaves 6 ranks.
  const Replan r = replan(job(12, 2), 3, 2, {1});
  EXPECT_EQ(r.world, 6);
  EXPECT_EQ(r.idle, 0);
  EXPECT_EQ(r.overrides, std::vector<std::string>{"--train.micro_batch=2"});
  EXPECT_EQ(sequences(r), 12);
  EXPECT_EQ(r.config.train.global_batch, 12);
}

TEST(Elastic, DataParallelLeavesIdleTheRanksTheBatchDoesNotDivideOver) {
  // Global batch 8 does not divide over 6 ranks: 4 run, 2 idle, and the notes say why.
  const Replan r = replan(job(8, 2), 3, 2, {2});
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.idle, 2);
  EXPECT_EQ(r.config.train.micro_batch, 2);
  EXPECT_EQ(sequences(r), 8);
  EXPECT_TRUE(says(r, "2 ranks left idle: train.global_batch 8 does not divide over more than 4 replicas"));
}

TEST(Elastic, MicroBatchShrinksOnlyWhenTheReplicasNeedIt) {
  // 8 sequences of micro-batch 4 over 4 replicas: 2 each, so the micro-batch becomes 2; over 2 it stays 4.
  const Replan four = replan(job(8, 4), 2, 2, {});
  EXPECT_EQ(four.world, 4);
  EXPECT_EQ(four.config.train.micro_batch, 2);
  EXPECT_TRUE(says(four, "micro-batch 2 (was 4)"));
  const Replan two = replan(job(8, 4), 1, 2, {1});
  EXPECT_EQ(two.world, 2);
  EXPECT_EQ(two.config.train.micro_batch, 4);
}

TEST(Elastic, TensorGroupsStayInsideNodes) {
  // tp 2 on nodes of 2 ranks: 3 survivors hold 3 replicas of 2 ranks; global batch 12 divides over 3.
  const Replan r = replan(job(12, 2, 2), 3, 2, {0});
  EXPECT_EQ(r.world, 6);
  EXPECT_EQ(make_topology(r.config, r.world).tp_size(), 2);
  EXPECT_EQ(sequences(r), 12);
  EXPECT_EQ(testing::error_of([] { replan(job(12, 2, 2), 3, 3, {0}); }),
            "replan: parallel.tp_size = 2 does not divide the 3 ranks per node: tensor groups must stay inside a "
            "node");
}

TEST(Elastic, PipelinesNotHitKeepTheirTemplateAndHitOnesAreRebuiltWithFewerStages) {
  // one, two, two, two, one on 4 nodes of 2 ranks: ranks 0 | 1-2 | 3-4 | 5-6 | 7. Node 1 (ranks 2, 3) takes a stage
  // of pipelines 1 and 2: the others keep theirs (4 ranks), and the 2 ranks left rebuild both from "one".
  const Config c = pipelined({kOne, kTwo}, "one,two,two,two,one", "one:4,two:4", 40, 2);
  const Replan r = replan(c, 3, 2, {1});
  EXPECT_EQ(r.world, 6);
  EXPECT_EQ(r.idle, 0);
  EXPECT_EQ(r.config.parallel.pipelines, "one,one,one,two,one");
  EXPECT_TRUE(says(r, "pipeline 1 (two, ranks 1-2) had ranks on a lost node: re-formed from template one (1 stage)"));
  EXPECT_TRUE(says(r, "pipeline 2 (two, ranks 3-4) had ranks on a lost node: re-formed from template one"));
  EXPECT_EQ(sequences(r), 40);
  EXPECT_EQ(r.config.train.micro_batch, 2);
  // The overrides say it all: the templates used, spelled out, the pipelines and their micro-batches.
  EXPECT_EQ(r.overrides[1], "--parallel.template=one: wte, wpe, h.0-h.3, ln_f");
  EXPECT_EQ(r.overrides[2], "--parallel.template=two: wte, wpe, h.0-h.1 | h.2-h.3, ln_f");
  EXPECT_EQ(r.overrides[3], "--parallel.pipelines=one,one,one,two,one");
  EXPECT_EQ(r.overrides.back().rfind("--parallel.microbatches=one:", 0), 0u);
}

TEST(Elastic, MicroBatchesFollowThroughput) {
  // A 2-stage pipeline runs a micro-batch at the pace of its slower stage, about half a 1-stage one's: it gets more
  // of the 16 micro-batches, as many as make the modelled step time, (m + stages - 1) x pace of the slower
  // pipeline, the least of every split.
  const Config c = pipelined({kOne, kTwo}, "one,two", "one:8,two:8", 16);
  const Replan r = replan(c, 3, 1, {});
  const std::vector<double> f = module_flops(kModel);
  double one = 0, first = 0, second = 0;
  for (int m = 0; m < module_count(kModel); m++) (m < block_module(2) ? first : second) += f[m], one += f[m];
  const double two = std::max(first, second);
  EXPECT_LT(two, one);
  auto step = [&](int m1) { return std::max(m1 * one, (16 - m1 + 1) * two); };
  const Topology t = make_topology(r.config, r.world);
  ASSERT_EQ(t.pipelines().size(), 2u);
  const int chosen = t.pipelines()[0].micro_batches;
  EXPECT_EQ(chosen + t.pipelines()[1].micro_batches, 16);
  EXPECT_GT(t.pipelines()[1].micro_batches, chosen);
  for (int m1 = 1; m1 < 16; m1++) EXPECT_LE(step(chosen), step(m1)) << m1;
}

TEST(Elastic, APipelineThatCannotBeRebuiltIsDropped) {
  // one, one on node 0 and two on node 1; node 0 lost: "two" keeps node 1 whole, nothing is left for the others.
  const Config c = pipelined({kOne, kTwo}, "one,one,two", "one:2,two:4", 8);
  const Replan r = replan(c, 1, 2, {0});
  EXPECT_EQ(r.config.parallel.pipelines, "two");
  EXPECT_EQ(r.config.parallel.microbatches, "two:8");
  EXPECT_TRUE(says(r, "pipeline 0 (one, rank 0) had ranks on a lost node: dropped (0 ranks left for it"));
  EXPECT_EQ(sequences(r), 8);
}

TEST(Elastic, WithoutAShallowerDeckTemplateAutoBalancesOne) {
  // A 2-stage pipeline over 2 nodes of one rank loses one: its one rank runs auto1, the whole model.
  const Replan r = replan(pipelined({kTwo}, "two", "two:4", 4), 1, 1, {1});
  EXPECT_EQ(r.config.parallel.pipelines, "auto1");
  EXPECT_EQ(r.overrides[1], "--parallel.template=auto1: wte, wpe, h.0-h.3, ln_f");
  EXPECT_EQ(r.world, 1);
}

TEST(Elastic, TheDeepestDeckTemplateThatFitsIsChosen) {
  // A 4-stage pipeline on 4 nodes of 1 rank loses node 3: of the deck's one, two and three, three fits.
  const Config c = pipelined({kOne, kTwo, "three: wte, wpe, h.0 | h.1-h.2 | h.3, ln_f", "four: auto:4"}, "four",
                             "four:4", 4);
  const Replan r = replan(c, 3, 1, {3});
  EXPECT_EQ(r.config.parallel.pipelines, "three");
  EXPECT_EQ(r.world, 3);
}

TEST(Elastic, TwoFailuresInARow) {
  // The second re-plan starts from the first's config: its layout, on its nodes.
  const Config c = pipelined({kOne, kTwo}, "one,two,two,two,one", "one:4,two:4", 40, 2);
  const Replan first = replan(c, 3, 2, {1});
  const Replan second = replan(first.config, 2, 2, {2});  // the old node 3 (ranks 4-5: two's stage 1, and one)
  EXPECT_EQ(second.world, 4);
  EXPECT_EQ(sequences(second), 40);
  EXPECT_EQ(second.config.parallel.pipelines, "one,one,one,one");
}

TEST(Elastic, CandidatesAreTheLayoutsTheRuleAllowsItsOwnFirst) {
  // one, two, two, two, one on 4 nodes of 2 ranks, node 1 lost (as above): pipelines 0, 3 and 4 keep their template
  // in every candidate; 1 and 2 are rebuilt from "one" or dropped; the 20 micro-batches are shared every way.
  const Config c = pipelined({kOne, kTwo}, "one,two,two,two,one", "one:4,two:4", 40, 2);
  const std::vector<Replan> all = replan_candidates(c, 3, 2, {1});
  ASSERT_GT(all.size(), 2u);
  EXPECT_EQ(all.front().overrides, replan(c, 3, 2, {1}).overrides);
  std::set<std::string> pipelines;
  std::set<std::vector<std::string>> distinct;
  bool other_sharing = false;
  for (const Replan& r : all) {
    SCOPED_TRACE(r.config.parallel.pipelines + " " + r.config.parallel.microbatches);
    EXPECT_EQ(sequences(r), 40);
    EXPECT_EQ(r.world + r.idle, 6);
    const std::string& p = r.config.parallel.pipelines;
    EXPECT_EQ(p.rfind("one,", 0), 0u);
    EXPECT_EQ(p.substr(p.size() - 8), ",two,one");
    pipelines.insert(p);
    distinct.insert(r.overrides);
    other_sharing |= says(r, "(another sharing)");
  }
  EXPECT_EQ(pipelines, (std::set<std::string>{"one,one,one,two,one", "one,one,two,one", "one,two,one"}));
  EXPECT_EQ(distinct.size(), all.size());
  EXPECT_TRUE(other_sharing);
}

TEST(Elastic, CandidatesTrySmallerMicroBatchesWhereTheDecksHasNoSharing) {
  // two (ranks 0-1), one (rank 2) on 3 nodes of a rank, 3 micro-batches of 4; node 0 lost: rebuilt from "one", two
  // copies of it cannot share 3 micro-batches, so the micro-batch changes: 3 (the rule's), 2 or 1; or, dropped,
  // the one left runs the 3 of 4.
  const Config c = pipelined({kOne, kTwo}, "two,one", "two:2,one:1", 12, 4);
  const std::vector<Replan> all = replan_candidates(c, 2, 1, {0});
  std::vector<int> sizes;
  for (const Replan& r : all) {
    EXPECT_EQ(sequences(r), 12);
    if (std::find(sizes.begin(), sizes.end(), r.config.train.micro_batch) == sizes.end())
      sizes.push_back(r.config.train.micro_batch);
  }
  EXPECT_EQ(sizes, (std::vector<int>{3, 2, 1, 4}));
  EXPECT_EQ(all.front().overrides, replan(c, 2, 1, {0}).overrides);
  EXPECT_EQ(all.front().config.train.micro_batch, 3);
}

TEST(Elastic, AJobTheSurvivorsCannotHoldIsRefusedSayingWhatItNeeds) {
  const FitCheck fits = [](const Config&, int world) {
    return world < 6 ? strf("%d ranks need 9 GiB each, the nodes have 8 GiB per rank", world) : std::string();
  };
  EXPECT_EQ(testing::error_of([&] { replan(job(8, 2), 2, 2, {0, 3}, fits); }),
            "replan: the 2 surviving nodes cannot hold the job on 4 ranks: 4 ranks need 9 GiB each, the nodes have 8 "
            "GiB per rank");
  EXPECT_EQ(testing::error_of([] { replan(job(8, 2), 0, 2, {0}); }), "replan: no node survived");
  EXPECT_EQ(testing::error_of([] { replan(job(8, 2), 2, 2, {5}); }),
            "replan: lost node 5 is not one of the job's 3 nodes (0 to 2)");
}

}  // namespace
}  // namespace yuan::layout
