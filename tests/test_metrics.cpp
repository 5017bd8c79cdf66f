// A training step's figures as the step line and the metrics.jsonl object (train/metrics.h): tools/plot_metrics.py and the
// tests read the object's keys, so their names and order are pinned here, as is the step line users grep.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/metrics.h"

namespace yuan {
namespace {

StepMetrics figures() {
  StepMetrics m;
  m.step = 10;
  m.steps = 100;
  m.loss = 5.12341;
  m.lr = 3e-4;
  m.grad_norm = 1.2345;
  m.tokens_per_s = 12345.4;
  m.mfu = 0.0123;
  m.step_s = 0.25;
  m.data_s = 0.01;
  m.compute_s = 0.2;
  m.comm_s = 0.03;
  m.optim_s = 0.02;
  m.optim_background_s = 0;
  m.local_ckpt_s = 0.04;
  m.eta_s = 62;
  m.tokens = 40960;
  m.peak_host_bytes = 1 << 20;
  m.base_host_bytes = 1 << 19;
  return m;
}

std::vector<std::string> keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> out;
  for (const auto& [k, v] : j.items()) out.push_back(k);
  return out;
}

TEST(StepMetrics, StepLineAsUsersReadIt) {
  StepMetrics m = figures();
  EXPECT_EQ(step_line(m), "step     10/100 | loss 5.1234 | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 1.2% | "
                          "250 ms/step | ETA 1m02s");
  m.bubble = 0.254;
  EXPECT_EQ(step_line(m), "step     10/100 | loss 5.1234 | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 1.2% | "
                          "250 ms/step | bubble 25% | ETA 1m02s");
  // A rank costing a quarter of the step or more, and a wait ridden out since the previous line.
  m.slowest_rank = 3;
  m.slowest_host = "node2";
  m.straggler_s = 0.07;
  m.stall = comm::LongestWait{3.25, "reduce_scatter", "world"};
  EXPECT_EQ(step_line(m), "step     10/100 | loss 5.1234 | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 1.2% | "
                          "250 ms/step | bubble 25% | slowest rank 3@node2 +70 ms | stalled 3.2 s in reduce_scatter "
                          "on group world | ETA 1m02s");
  m.straggler_s = 0.06;  // under a quarter of the step: noise
  EXPECT_EQ(step_line(m).find("slowest"), std::string::npos);
  // Every rank waiting most of the step (a slow link): shown past three quarters of it.
  m.stall.reset();
  m.all_wait_s = 0.2;
  EXPECT_EQ(step_line(m), "step     10/100 | loss 5.1234 | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 1.2% | "
                          "250 ms/step | bubble 25% | all ranks waiting 80% | ETA 1m02s");
  m.all_wait_s = 0.18;
  EXPECT_EQ(step_line(m).find("waiting"), std::string::npos);
  // An MFU the trainer could not trust (it read over 100%) is not shown, nor written as a number.
  m.mfu = NAN;
  EXPECT_NE(step_line(m).find("| MFU ? |"), std::string::npos) << step_line(m);
  EXPECT_TRUE(nlohmann::json::parse(step_record(m).str())["mfu"].is_null());
}

TEST(StepMetrics, RecordKeysInTheirOrder) {
  StepMetrics m = figures();
  const std::vector<std::string> plain = {"step",      "loss",       "lr",      "grad_norm",          "tokens_per_s",
                                          "mfu",       "step_s",     "data_s",  "compute_s",          "comm_s",
                                          "wait_max_s", "slowest_rank", "straggler_s", "all_wait_s",
                                          "optim_s",   "optim_background_s",    "local_ckpt_s", "skipped", "tokens",
                                          "peak_host_bytes", "base_host_bytes", "comm_bytes"};
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(step_record(m).str());
  EXPECT_EQ(keys(j), plain);
  EXPECT_EQ(j["step"], 10);
  EXPECT_EQ(j["skipped"], 0);
  EXPECT_EQ(j["tokens"], 40960);
  EXPECT_EQ(j["local_ckpt_s"], 0.04);
  EXPECT_EQ(j["comm_bytes"], nlohmann::ordered_json::object());
  // Pipelined: the bubble and each stage's busy share last.
  m.bubble = 0.25;
  m.stage_busy = {1.0, 0.5};
  std::vector<std::string> pipelined = plain;
  pipelined.push_back("bubble");
  pipelined.push_back("stage_busy");
  const nlohmann::ordered_json p = nlohmann::ordered_json::parse(step_record(m).str());
  EXPECT_EQ(keys(p), pipelined);
  EXPECT_EQ(p["stage_busy"], nlohmann::ordered_json::parse("[1.0, 0.5]"));
}

// comm_bytes holds the step's growth of each group's account, the operations that moved bytes only; the world's
// account (scalars, shared communicators) is not reported.
TEST(StepMetrics, CommBytesAreTheStepsTrafficByGroupAndOperation) {
  StepMetrics m = figures();
  const auto at = [](comm::Group g) { return static_cast<int>(g); };
  const auto op = [](CommOp o) { return static_cast<int>(o); };
  m.traffic_start[at(comm::Group::Data)].bytes[op(CommOp::ReduceScatter)] = 100;
  m.traffic_end[at(comm::Group::Data)].bytes[op(CommOp::ReduceScatter)] = 400;
  m.traffic_end[at(comm::Group::Data)].bytes[op(CommOp::AllGather)] = 50;
  m.traffic_start[at(comm::Group::Tensor)].bytes[op(CommOp::AllReduce)] = 7;  // unchanged: left out
  m.traffic_end[at(comm::Group::Tensor)].bytes[op(CommOp::AllReduce)] = 7;
  m.traffic_end[at(comm::Group::Pipeline)].bytes[op(CommOp::Send)] = 8;
  m.traffic_end[at(comm::Group::World)].bytes[op(CommOp::AllReduce)] = 9;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(step_record(m).str());
  EXPECT_EQ(j["comm_bytes"].dump(), R"({"data":{"reduce_scatter":300,"all_gather":50},"pipeline":{"send":8}})");
}

}  // namespace
}  // namespace yuan
