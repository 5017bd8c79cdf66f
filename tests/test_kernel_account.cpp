// The kernel account's arithmetic: each op's FLOPs and ideal bytes (src/ops/op_cost.h) against numbers counted by
// hand for small shapes, the roofline of an operation, and kernels.json's fields (backend/kernel_account.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/kernel_account.h"
#include "ops/op_cost.h"

namespace {

using namespace yuan;
using namespace yuan::ops;

constexpr Widths kBf16{2, 2};

void expect_cost(const OpCost& c, double flops, double bytes) {
  EXPECT_DOUBLE_EQ(c.flops, flops);
  EXPECT_DOUBLE_EQ(c.bytes, bytes);
}

TEST(OpCost, Encoder) {
  // N = 6 rows of C = 4: 24 adds; wte rows 48 B, wpe's 3 rows 24 B, ids 24 B, out 48 B.
  expect_cost(encoder_forward_cost(2, 3, 4, kBf16), 24, 48 + 24 + 24 + 48);
  // Two adds per fp32 dout element; dout 96 B, ids 24, dwte rows read and written 192, dwpe's 3 rows 96.
  expect_cost(encoder_backward_cost(2, 3, 4), 48, 96 + 24 + 192 + 96);
}

TEST(OpCost, LayerNorm) {
  // N = 4, C = 8 in bf16: 8 FLOPs an element; x 64 B, w and b 32, y 64, mean and rstd 32.
  expect_cost(layernorm_forward_cost(4, 8, kBf16), 8 * 32, 64 + 32 + 64 + 32);
  // 14 an element; dout and x 128 B, w 16, mean and rstd 32, dres in and out 256, dw and db in and out 128,
  // dres_op 64 (none in fp32 on the CPU, where dres is what the matmuls read).
  expect_cost(layernorm_backward_cost(4, 8, kBf16, true), 14 * 32, 128 + 16 + 32 + 256 + 128 + 64);
  expect_cost(layernorm_backward_cost(4, 8, {4, 4}, false), 14 * 32, 256 + 32 + 32 + 256 + 128);
  // out, residual read and out written (3 x 64 B), bias 16: two adds an element.
  expect_cost(bias_residual_cost(4, 8, kBf16), 64, 192 + 16);
}

TEST(OpCost, Matmul) {
  // N = 2, C = 3, OC = 4: 8 dot products of 3, 2 N C OC = 48 FLOPs; in 12 B, w 24, out 16, bias 8, residual 16.
  expect_cost(matmul_forward_cost(2, 3, 4, kBf16, true, true, false), 48, 12 + 24 + 16 + 8 + 16);
  // The GELU epilogue also writes its input: 16 B more.
  expect_cost(matmul_forward_cost(2, 3, 4, kBf16, true, false, true), 48, 12 + 24 + 16 + 8 + 16);
  expect_cost(matmul_forward_cost(2, 3, 4, kBf16, false, false, false), 48, 12 + 24 + 16);
  // Two GEMMs; dout 16 B, w 24, in 12, dinp 12, fp32 dw read and written 96, dbias 32, pre_gelu 12.
  expect_cost(matmul_backward_cost(2, 3, 4, kBf16, true, true), 96, 16 + 24 + 12 + 12 + 96 + 32 + 12);
}

TEST(OpCost, AttentionCountsTheCausalHalf) {
  // B = 1, T = 4, two heads of 4: 10 (query, key) pairs a head at or below the diagonal, each q.k and its share of
  // att @ v, 2 x 4 FLOPs each: 16 a pair, 160 a head, 320 (the full 4 x 4 would be 512).
  expect_cost(attention_forward_cost(1, 4, 8, 2, kBf16), 320, 4 * 24 * 2 + 4 * 8 * 2 + 4 * 2 * 4);
  // Five products of the same pairs; qkv 192 B, out and dout 128, lse 32, dqkv 192.
  expect_cost(attention_backward_cost(1, 4, 8, 2, kBf16), 800, 192 + 128 + 32 + 192);
}

TEST(OpCost, Classifier) {
  // N = 2 rows of V = 5 logits: 4 FLOPs a logit for the loss, 6 with the gradient; logits 20 B (40 with the
  // gradient written back), targets 8, losses 8.
  expect_cost(classifier_cost(2, 5, kBf16, true), 60, 20 + 8 + 8 + 20);
  expect_cost(classifier_cost(2, 5, kBf16, false), 40, 20 + 8 + 8);
  expect_cost(classifier_row_max_cost(2, 5, kBf16), 10, 20 + 8);
  expect_cost(classifier_row_sums_cost(2, 5, kBf16), 30, 20 + 16 + 16);
  expect_cost(classifier_finish_cost(2, 5, kBf16, true), 40, 40 + 32 + 8);
}

TEST(OpCost, MemoryOptimizerAndCollectives) {
  expect_cost(copy_cost(10, 4, 2), 0, 60);  // a cast reads 4 bytes and writes 2
  expect_cost(fill_cost(64), 0, 64);
  expect_cost(transfer_cost(64), 0, 64);
  // AdamW: fp32 master, m, v and gradient read (16 B), master, m, v written (12) and the bf16 copy (2): 30 B.
  expect_cost(adamw_cost(10, 2), 150, 300);
  expect_cost(adamw_cost(10, 0), 150, 280);
  expect_cost(grad_norm_cost(10), 20, 40);
  // A ring all-reduce sends 2 (P-1)/P of the buffer from each rank; the others (P-1)/P, or all of it.
  expect_cost(collective_cost(Collective::AllReduce, 1000, 4), 0, 1500);
  expect_cost(collective_cost(Collective::ReduceScatter, 1000, 4), 0, 750);
  expect_cost(collective_cost(Collective::AllGather, 1000, 4), 0, 750);
  expect_cost(collective_cost(Collective::Broadcast, 1000, 4), 0, 1000);
  expect_cost(collective_cost(Collective::SendRecv, 1000, 2), 0, 1000);
  expect_cost(collective_cost(Collective::AllReduce, 1000, 1), 0, 0);
}

AccountedOp op_of(double flops, double bytes, double time_s, Roof roof = Roof::Device) {
  AccountedOp op;
  op.name = "op";
  op.family = "matmul";
  op.phase = "forward";
  op.shape = "N=1 C=1 OC=1";
  op.calls = op.launches = 1;
  op.flops = flops;
  op.ideal_bytes = bytes;
  op.time_s = time_s;
  op.roof = roof;
  op.kernels.push_back(KernelTime{});
  op.kernels[0].name = "cublasLt gemm";
  op.kernels[0].launches = 1;
  op.kernels[0].time_s = time_s;
  return op;
}

TEST(KernelAccount, Roofline) {
  AccountPeak peak;
  peak.flops = 1e15;
  peak.bytes_per_s = 1e12;
  // 2 ms of compute at peak, 1 ms of memory, in 10 ms: compute-bound at 20% of the roofline.
  Roofline r = roofline(op_of(2e12, 1e9, 0.01), peak);
  EXPECT_DOUBLE_EQ(r.tflops, 200);
  EXPECT_DOUBLE_EQ(r.gbps, 100);
  ASSERT_TRUE(r.fraction);
  EXPECT_DOUBLE_EQ(*r.fraction, 0.2);
  EXPECT_STREQ(r.bound, "compute");
  r = roofline(op_of(1e11, 4e9, 0.01), peak);
  EXPECT_STREQ(r.bound, "memory");
  EXPECT_DOUBLE_EQ(*r.fraction, 0.4);
  // A collective: the link's rate, none when the device's link is not known.
  r = roofline(op_of(0, 1e9, 1, Roof::Link), peak);
  EXPECT_STREQ(r.bound, "link");
  EXPECT_FALSE(r.fraction);
  peak.link_bytes_per_s = 1e10;
  EXPECT_DOUBLE_EQ(*roofline(op_of(0, 1e9, 1, Roof::Link), peak).fraction, 0.1);
  EXPECT_FALSE(roofline(op_of(0, 1e9, 1, Roof::Host), peak).fraction);
}

TEST(KernelAccount, JsonFieldsAndTable) {
  KernelReport r;
  r.device = "test device";
  r.first = 2;
  r.last = 3;
  r.step_s = 0.04;
  r.busy_s = 0.03;
  r.peak.flops = 1e15;
  r.peak.bytes_per_s = 1e12;
  r.peak.source = "test";
  r.ops.push_back(op_of(2e12, 1e9, 0.01));
  r.ops.back().exempt = "why";
  r.ops.push_back(op_of(0, 1e6, 0.001, Roof::Host));
  for (const bool emulated : {false, true}) {
    r.emulated = emulated;
    const nlohmann::json j = nlohmann::json::parse(kernel_json(r));
    EXPECT_EQ(j["times"], emulated ? "meaningless: emulated device" : "measured");
    EXPECT_EQ(j["steps"], nlohmann::json({2, 3}));
    EXPECT_DOUBLE_EQ(j["unaccounted_share"].get<double>(), 0.25);
    const nlohmann::json& o = j["operations"][0];
    EXPECT_EQ(o["bound"], "compute");
    EXPECT_DOUBLE_EQ(o["roofline_fraction"].get<double>(), 0.2);
    EXPECT_EQ(o["exempt"], "why");
    EXPECT_FALSE(j["operations"][1].contains("exempt"));
    EXPECT_TRUE(j["operations"][1]["roofline_fraction"].is_null());
    // The emulator's traffic, at the kernel and the op level, only where there is an emulator to count it.
    EXPECT_EQ(o["kernels"][0].contains("sector_efficiency"), emulated);
    EXPECT_EQ(o.contains("touched_bytes"), emulated);
  }
  const std::string table = kernel_table(r);
  EXPECT_NE(table.find("kernel account, steps 2-3, times meaningless: emulated device"), std::string::npos) << table;
  EXPECT_NE(table.find("unaccounted: 25.0%"), std::string::npos) << table;
  EXPECT_NE(table.find(" 20.0% compute (exempt)"), std::string::npos) << table;
}

}  // namespace
