// The fast checkpoint tier's choice of what to resume from (train/local_choice.h), on listings made up here: the
// newest complete generation against run.dir/ckpt's newest, a generation that lacks a shard, copies that fail their
// verification and the partner copy that stands in for them, and where the previous run's log ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/local_choice.h"
#include "util/error.h"
#include "util/fs.h"

namespace yuan {
namespace {
using nlohmann::json;

const std::vector<std::string> kHosts = {"n1", "n1", "n2", "n2"};

// A listing entry: old rank `rank`'s copy of (run, step) in a world of `world` (ranks 0-1 on n1, 2-3 on n2, each
// partnered with the same local rank of the other node), held by `holder`.
json copy(int64_t run, int64_t step, int world, int rank, int holder, bool own) {
  json m = {{"run", run}, {"step", step}, {"world", world}, {"rank", rank}, {"hosts", kHosts}, {"partners", {2, 3, 0, 1}}};
  const std::string path = strf("/shm/%sstep_%07lld/rank_%05d", own ? "" : "partner/", static_cast<long long>(step), rank);
  return {{"holder", holder}, {"own", own}, {"path", path}, {"manifest", m}};
}

// Every copy of (run, step), own on its rank's node (held by rank 0 or 2) and partner on the other, but `lost`.
std::vector<std::string> listings(const std::vector<json>& copies) {
  json n1 = json::array(), n2 = json::array();
  for (const json& c : copies) (c["holder"] == 0 ? n1 : n2).push_back(c);
  return {n1.dump(), "[]", n2.dump(), "[]"};
}

std::vector<json> generation(int64_t run, int64_t step, const std::vector<int>& lost_nodes = {}) {
  std::vector<json> out;
  for (int r = 0; r < 4; r++) {
    const int own_holder = r < 2 ? 0 : 2, partner_holder = 2 - own_holder;
    for (const auto& [holder, own] : {std::pair{own_holder, true}, std::pair{partner_holder, false}})
      if (std::find(lost_nodes.begin(), lost_nodes.end(), holder) == lost_nodes.end())
        out.push_back(copy(run, step, 4, r, holder, own));
  }
  return out;
}

std::vector<json> plus(std::vector<json> a, const std::vector<json>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ResumeChoice::Candidate fs_checkpoint(int64_t run, int64_t step) {
  ResumeChoice::Candidate c;
  c.dir = strf("run/ckpt/step_%07lld", static_cast<long long>(step));
  c.run = run;
  c.step = step;
  return c;
}

TEST(LocalChoice, TheNewestCompleteGenerationWinsFromOwnCopiesOnceVerified) {
  Chooser c(listings(plus(generation(1, 4), generation(1, 6))), {fs_checkpoint(1, 2)}, kHosts);
  EXPECT_EQ(c.max_run(), 1);
  EXPECT_EQ(c.newest(), "step_0000006 of run 1, in /shm/step_0000006 on n1");
  const json round = c.next();
  EXPECT_FALSE(round["final"].get<bool>());
  ASSERT_EQ(round["assign"].size(), 4u);
  for (const json& a : round["assign"]) {
    EXPECT_EQ(a["manifest"]["step"], 6);
    EXPECT_TRUE(a["own"].get<bool>()) << a.dump();
  }
  c.verdicts({"[]", "[]", "[]", "[]"});
  const json final = c.next();
  EXPECT_TRUE(final["final"].get<bool>());
  EXPECT_EQ(final["assign"], round["assign"]);
}

TEST(LocalChoice, ALostNodeLeavesThePartnerCopiesAndAShardOnNoNodeAnOlderGeneration) {
  // Node n2 lost: step 6's ranks 2-3 are held by n1's partner copies; step 8 only ever had rank 0-1 copies.
  std::vector<json> step8 = {copy(1, 8, 4, 0, 0, true), copy(1, 8, 4, 1, 0, true)};
  Chooser c(listings(plus(generation(1, 6, {2}), step8)), {}, kHosts);
  const json round = c.next();
  ASSERT_FALSE(round["final"].get<bool>());
  ASSERT_EQ(round["assign"].size(), 4u);
  EXPECT_EQ(round["assign"][0]["manifest"]["step"], 6);
  EXPECT_FALSE(round["assign"][2]["own"].get<bool>());
  EXPECT_EQ(round["assign"][2]["holder"], 0);
}

TEST(LocalChoice, AFailedCopyGivesWayToItsPartnerCopyThenToTheFilesystem) {
  Chooser c(listings(generation(2, 6)), {fs_checkpoint(1, 4)}, kHosts);
  json round = c.next();
  // Rank 1's own copy fails on its holder: the partner copy on n2 stands in.
  c.verdicts({json::array({{{"rank", 1}, {"path", round["assign"][1]["path"]}, {"why", "corrupt"}}}).dump(), "[]"});
  round = c.next();
  ASSERT_FALSE(round["final"].get<bool>());
  EXPECT_EQ(round["assign"][1]["holder"], 2);
  EXPECT_FALSE(round["assign"][1]["own"].get<bool>());
  // Both of rank 1's copies fail: the filesystem checkpoint is verified next, and loaded once it is.
  c.verdicts({"[]", json::array({{{"rank", 1}, {"path", round["assign"][1]["path"]}, {"why", "corrupt"}}}).dump()});
  round = c.next();
  EXPECT_FALSE(round["final"].get<bool>());
  EXPECT_EQ(round["fs"], "run/ckpt/step_0000004");
  c.fs_verdict("");
  EXPECT_EQ(c.next(), json({{"final", true}, {"fs", "run/ckpt/step_0000004"}}));
}

TEST(LocalChoice, TheFilesystemWinsATieAndNothingThatVerifiesStartsOver) {
  Chooser tie(listings(generation(1, 4)), {fs_checkpoint(1, 4), fs_checkpoint(1, 2)}, kHosts);
  json round = tie.next();
  EXPECT_EQ(round["fs"], "run/ckpt/step_0000004");
  // Refused: the older filesystem checkpoint is older than step 4, which is verified next.
  tie.fs_verdict("state.json is missing");
  round = tie.next();
  ASSERT_TRUE(round.contains("assign")) << round.dump();
  EXPECT_EQ(round["assign"][0]["manifest"]["step"], 4);

  Chooser none({"[]"}, {fs_checkpoint(1, 2)}, kHosts);
  EXPECT_EQ(none.newest(), "");
  none.fs_verdict("state.json is missing");
  EXPECT_EQ(none.next(), json({{"final", true}}));
}

TEST(LocalChoice, AHolderVerifiesOnlyTheCopiesItHolds) {
  const json assign = json::array({{{"rank", 0}, {"holder", 1}, {"path", "/nonexistent/a"},
                                    {"manifest", {{"files", {{{"name", "f"}, {"crc32c", "00000000"}}}}}}}});
  EXPECT_EQ(verify_assigned(assign, 0), "[]");
  const json failed = json::parse(verify_assigned(assign, 1));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]["rank"], 0);
  EXPECT_NE(failed[0]["why"].get<std::string>().find("is missing"), std::string::npos);
}

TEST(LocalChoice, TheLastLoggedStepIgnoresATornLine) {
  const std::string path = ::testing::TempDir() + "local_choice_metrics.jsonl";
  EXPECT_EQ(last_logged_step(path + ".none"), -1);
  write_file_atomic(path, "{\"step\": 1}\n{\"step\": 2, \"loss\": 3.5}\n{\"step\": 3, \"lo");
  EXPECT_EQ(last_logged_step(path), 2);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace yuan
