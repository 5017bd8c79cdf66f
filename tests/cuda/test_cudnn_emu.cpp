// cuDNN's fused attention through its frontend, built as cuda/cudnn_attention.cpp builds it (llm.c's graphs: Q, K, V
// strided views of one [B, T, 3, NH, HS] bf16 buffer, a causal mask, the scale by value, the softmax statistics
// written forward and read backward, the deterministic backward), against causal attention computed here in double
// from the same bf16 inputs; and what cuDNN refuses for those graphs. On the emulator this is cuda/emu/cudnn.cpp's
// interpreter under the frontend; on a GPU, cuDNN itself.
// Tolerances as tests/cuda/test_attention.cu's: O 1e-2 (bf16 output), statistics 1e-3 absolute (fp32), dQ, dK, dV
// 2e-2 (bf16 outputs from fp32 sums of bf16 products).
#ifdef YUAN_CUDNN
#include <cudnn_frontend.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cudnn_attention.h"
#include "gpu_test.h"
#ifdef YUAN_EMU
#include <cuda_emu.h>
#endif

namespace {

using namespace yuan::test;
namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kScale, kO, kStats, kDO, kDQ, kDK, kDV };

struct Layout {
  int64_t B, NH, T, HS;
  int64_t token_stride = 0;  // elements from one token's q to the next one's: 3 C unless a test pads it
  int64_t spread = 1;        // elements from one q, k or v element to the next: 1 unless a test spreads them
  fe::DataType_t io = fe::DataType_t::BFLOAT16;
  int64_t C() const { return NH * HS; }
  int64_t tok() const { return token_stride ? token_stride : 3 * C(); }
  std::vector<int64_t> dims() const { return {B, NH, T, HS}; }
  std::vector<int64_t> qkv_strides() const { return {spread * tok() * T, spread * HS, spread * tok(), spread}; }
  std::vector<int64_t> out_strides() const { return {C() * T, HS, C(), 1}; }
};

using GraphP = std::shared_ptr<fe::graph::Graph>;
using TensorP = std::shared_ptr<fe::graph::Tensor_attributes>;

GraphP new_graph(const Layout& l) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(l.io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}
TensorP input(const GraphP& g, const char* name, int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims).set_stride(strides).set_uid(uid));
}
TensorP scale_tensor(const GraphP& g) {
  return g->tensor(fe::graph::Tensor_attributes()
                       .set_name("attn_scale")
                       .set_dim({1, 1, 1, 1})
                       .set_stride({1, 1, 1, 1})
                       .set_uid(kScale)
                       .set_is_pass_by_value(true)
                       .set_data_type(fe::DataType_t::FLOAT));
}

GraphP forward_graph(const Layout& l) {
  GraphP g = new_graph(l);
  auto q = input(g, "Q", kQ, l.dims(), l.qkv_strides()), k = input(g, "K", kK, l.dims(), l.qkv_strides()),
       v = input(g, "V", kV, l.dims(), l.qkv_strides());
  auto options = fe::graph::SDPA_attributes()
                     .set_name("flash_attention")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(scale_tensor(g))
                     .set_implementation(fe::AttentionImplementation_t::COMPOSITE);
  auto [o, stats] = g->sdpa(q, k, v, options);
  o->set_output(true).set_dim(l.dims()).set_stride(l.out_strides()).set_uid(kO);
  stats->set_output(true)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({l.B, l.NH, l.T, 1})
      .set_stride({l.NH * l.T, l.T, 1, 1})
      .set_uid(kStats);
  return g;
}

GraphP backward_graph(const Layout& l) {
  GraphP g = new_graph(l);
  auto q = input(g, "Q", kQ, l.dims(), l.qkv_strides()), k = input(g, "K", kK, l.dims(), l.qkv_strides()),
       v = input(g, "V", kV, l.dims(), l.qkv_strides()), o = input(g, "O", kO, l.dims(), l.out_strides()),
       d_o = input(g, "dO", kDO, l.dims(), l.out_strides());
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_dim({l.B, l.NH, l.T, 1})
                             .set_stride({l.NH * l.T, l.T, 1, 1})
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("flash_attention_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(scale_tensor(g))
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  dq->set_output(true).set_dim(l.dims()).set_stride(l.qkv_strides()).set_uid(kDQ);
  dk->set_output(true).set_dim(l.dims()).set_stride(l.qkv_strides()).set_uid(kDK);
  dv->set_output(true).set_dim(l.dims()).set_stride(l.qkv_strides()).set_uid(kDV);
  return g;
}

// validate through build_plans, as cuda/cudnn_attention.cpp does; the first error.
fe::error_t build(fe::graph::Graph& g, cudnnHandle_t h) {
  if (fe::error_t e = g.validate(); e.is_bad()) return e;
  if (fe::error_t e = g.build_operation_graph(h); e.is_bad()) return e;
  if (fe::error_t e = g.create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) return e;
  if (fe::error_t e = g.check_support(h); e.is_bad()) return e;
  return g.build_plans(h);
}

int64_t workspace_size(const fe::graph::Graph& g) {
  int64_t ws = -1;
  EXPECT_TRUE(g.get_workspace_size(ws).is_good());
  return ws;
}

class CudnnFrontend : public testing::Test {
 protected:
  // Through the frontend's shim, as the product calls cuDNN: the GPU build loads libcudnn.so.9 at run time
  // (cudnn_attention_problem opens it, and says why not), the emulator's links the emulated one.
  void SetUp() override {
    YUAN_REQUIRE_GPU();
    const std::string why = yuan::gpu::cudnn_attention_problem(64, 64);
    if (!why.empty()) GTEST_SKIP() << "no cuDNN here: " << why;
    ASSERT_EQ(fe::detail::create_handle(&handle_), CUDNN_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_) fe::detail::destroy_handle(handle_);
  }
  cudnnHandle_t handle_ = nullptr;
};

// Causal attention in double from the bf16 values: O, the statistics (log-sum-exp of the scaled scores), and the
// gradients for dO.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv;  // o, dq, dk, dv as [B, T, NH, HS]; lse as [B, NH, T]
};
Reference reference(const Layout& l, const std::vector<float>& qkv, const std::vector<float>& d_out) {
  const int64_t B = l.B, NH = l.NH, T = l.T, HS = l.HS, C = l.C();
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  Reference r;
  r.o.assign(B * T * C, 0), r.lse.assign(B * NH * T, 0), r.dq.assign(B * T * C, 0), r.dk.assign(B * T * C, 0),
      r.dv.assign(B * T * C, 0);
  auto at = [&](int64_t b, int64_t t, int which, int64_t h) { return &qkv[(b * T + t) * 3 * C + which * C + h * HS]; };
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      std::vector<double> p(T * T, 0.0);
      for (int64_t t = 0; t < T; t++) {
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; u++) {
          double s = 0;
          for (int64_t i = 0; i < HS; i++) s += static_cast<double>(at(b, t, 0, h)[i]) * at(b, u, 1, h)[i];
          p[t * T + u] = s * scale;
          mx = std::max(mx, p[t * T + u]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; u++) sum += p[t * T + u] = std::exp(p[t * T + u] - mx);
        for (int64_t u = 0; u <= t; u++) p[t * T + u] /= sum;
        r.lse[(b * NH + h) * T + t] = mx + std::log(sum);
        double* o = &r.o[(b * T + t) * C + h * HS];
        for (int64_t u = 0; u <= t; u++)
          for (int64_t i = 0; i < HS; i++) o[i] += p[t * T + u] * at(b, u, 2, h)[i];
      }
      for (int64_t t = 0; t < T; t++) {
        const float* dO = &d_out[(b * T + t) * C + h * HS];
        const double* o = &r.o[(b * T + t) * C + h * HS];
        double delta = 0;
        for (int64_t i = 0; i < HS; i++) delta += dO[i] * o[i];
        for (int64_t u = 0; u <= t; u++) {
          double dp = 0;
          for (int64_t i = 0; i < HS; i++) dp += static_cast<double>(dO[i]) * at(b, u, 2, h)[i];
          const double pu = p[t * T + u], ds = pu * (dp - delta) * scale;
          for (int64_t i = 0; i < HS; i++) {
            r.dv[(b * T + u) * C + h * HS + i] += pu * dO[i];
            r.dq[(b * T + t) * C + h * HS + i] += ds * at(b, u, 1, h)[i];
            r.dk[(b * T + u) * C + h * HS + i] += ds * at(b, t, 0, h)[i];
          }
        }
      }
    }
  return r;
}

// Max |got - ref| / max |ref|; every element of `got` compared (an unwritten NaN fails).
double err(const std::vector<float>& got, const std::vector<double>& ref) {
  double e = 0, m = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    e = std::max(e, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY);
    m = std::max(m, std::fabs(ref[i]));
  }
  return e / m;
}

// One of the three [B, T, NH, HS] parts (0 q, 1 k, 2 v) of a [B, T, 3, NH, HS] buffer.
std::vector<float> part(const Layout& l, const std::vector<float>& x, int which) {
  const int64_t C = l.C();
  std::vector<float> out(l.B * l.T * C);
  for (int64_t bt = 0; bt < l.B * l.T; bt++)
    for (int64_t c = 0; c < C; c++) out[bt * C + c] = x[bt * 3 * C + which * C + c];
  return out;
}

class CudnnFrontendSdpa : public CudnnFrontend, public testing::WithParamInterface<Layout> {};

TEST_P(CudnnFrontendSdpa, ForwardAndBackwardMatchCausalAttention) {
  const Layout l = GetParam();
  const int64_t C = l.C(), BT = l.B * l.T;
  const std::vector<float> qkv = round_bf16(randn(BT * 3 * C, 1.0f, 7 + l.T + l.HS)),
                           d_out = round_bf16(randn(BT * C, 1.0f, 9 + l.HS));
  const Reference ref = reference(l, qkv, d_out);
  float scale = 1.0f / std::sqrt(static_cast<float>(l.HS));

  GraphP fwd = forward_graph(l), bwd = backward_graph(l);
  fe::error_t fe_err = build(*fwd, handle_), be_err = build(*bwd, handle_);
  ASSERT_TRUE(fe_err.is_good()) << fe_err.get_message();
  ASSERT_TRUE(be_err.is_good()) << be_err.get_message();

  DevArray<uint16_t> d_qkv(to_bf16(qkv)), d_o(BT * C), d_do(to_bf16(d_out)), d_dqkv(BT * 3 * C);
  DevArray<float> d_stats(BT * l.NH);
  const int64_t fwd_ws = workspace_size(*fwd), bwd_ws = workspace_size(*bwd);
  DevArray<uint8_t> ws(std::max<int64_t>({fwd_ws, bwd_ws, 1}));
  uint16_t* qkv_p = d_qkv.get();
  std::unordered_map<int64_t, void*> pack = {{kQ, qkv_p},          {kK, qkv_p + C},        {kV, qkv_p + 2 * C},
                                             {kScale, &scale},     {kO, d_o.get()},        {kStats, d_stats.get()}};
  fe::error_t fx = fwd->execute(handle_, pack, ws.get());
  ASSERT_TRUE(fx.is_good()) << fx.get_message();
  const std::vector<float> o = from_bf16(d_o.download()), stats = d_stats.download();
  EXPECT_LT(err(o, ref.o), 1e-2) << "O";
  double lse_err = 0;  // stats is [B, NH, T], as ref.lse
  for (size_t i = 0; i < stats.size(); i++) lse_err = std::max(lse_err, std::fabs(stats[i] - ref.lse[i]));
  EXPECT_LT(lse_err, 1e-3) << "softmax statistics";

  uint16_t* dqkv_p = d_dqkv.get();
  pack.insert({{kDO, d_do.get()}, {kDQ, dqkv_p}, {kDK, dqkv_p + C}, {kDV, dqkv_p + 2 * C}});
  fe::error_t bx = bwd->execute(handle_, pack, ws.get());
  ASSERT_TRUE(bx.is_good()) << bx.get_message();
  const std::vector<float> dqkv = from_bf16(d_dqkv.download());
  EXPECT_LT(err(part(l, dqkv, 0), ref.dq), 2e-2) << "dQ";
  EXPECT_LT(err(part(l, dqkv, 1), ref.dk), 2e-2) << "dK";
  EXPECT_LT(err(part(l, dqkv, 2), ref.dv), 2e-2) << "dV";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnFrontendSdpa,
                         testing::Values(Layout{2, 2, 64, 16}, Layout{2, 2, 70, 32}, Layout{2, 2, 64, 64},
                                         Layout{1, 2, 70, 128}),
                         [](const testing::TestParamInfo<Layout>& i) {
                           return "T" + std::to_string(i.param.T) + "_hs" + std::to_string(i.param.HS);
                         });

// The refusal's message names the reason; on the emulator, where cuda/emu/cudnn.cpp words it (the frontend refuses
// some graphs before cuDNN sees them, in its own words).
void expect_refused(fe::error_t e, const char* emulator_reason) {
  EXPECT_TRUE(e.is_bad());
#ifdef YUAN_EMU
  if (*emulator_reason) {
    EXPECT_NE(e.get_message().find(emulator_reason), std::string::npos) << e.get_message();
  }
#else
  (void)emulator_reason;
#endif
}

// Head sizes the fused-attention engines have no kernel for: not a multiple of 8 (the frontend refuses it), above
// 256 (cuDNN does).
TEST_F(CudnnFrontend, RefusesHeadSizes) {
  GraphP g12 = forward_graph(Layout{2, 2, 64, 12}), g264 = forward_graph(Layout{2, 2, 64, 264});
  expect_refused(build(*g12, handle_), "");
  expect_refused(build(*g264, handle_), "head size 264");
}

TEST_F(CudnnFrontend, RefusesFp32Io) {
  Layout l{2, 2, 64, 32};
  l.io = fe::DataType_t::FLOAT;
  GraphP g = forward_graph(l);
  expect_refused(build(*g, handle_), "is not bf16 or fp16");
}

// Q, K and V with their head dims 8 elements (16 bytes) apart: every stride 16-byte aligned, none 1 (the frontend
// refuses it).
TEST_F(CudnnFrontend, RefusesAHeadDimThatIsNotContiguous) {
  Layout l{2, 2, 64, 32};
  l.spread = 8;
  GraphP g = forward_graph(l);
  expect_refused(build(*g, handle_), "");
}

// A token stride of 3 C + 1 bf16 elements: q, k and v rows are not 16-byte aligned (the frontend refuses it).
TEST_F(CudnnFrontend, RefusesStridesNotMultiplesOf16Bytes) {
  Layout l{2, 2, 64, 32};
  l.token_stride = 3 * l.C() + 1;
  GraphP g = forward_graph(l);
  EXPECT_TRUE(build(*g, handle_).is_bad());
}

// The backward graph of a [2, 2, 64, 32] layout, built, and its device buffers.
class CudnnFrontendExecute : public CudnnFrontend {
 protected:
  void SetUp() override {
    CudnnFrontend::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const size_t n = static_cast<size_t>(BT * C);
    qkv_ = std::make_unique<DevArray<uint16_t>>(to_bf16(round_bf16(randn(3 * n, 1.0f, 3))));
    o_ = std::make_unique<DevArray<uint16_t>>(to_bf16(round_bf16(randn(n, 1.0f, 4))));
    do_ = std::make_unique<DevArray<uint16_t>>(to_bf16(round_bf16(randn(n, 1.0f, 5))));
    dqkv_ = std::make_unique<DevArray<uint16_t>>(3 * n);
    stats_ = std::make_unique<DevArray<float>>(std::vector<float>(static_cast<size_t>(BT * l_.NH), 0.0f));
    graph_ = backward_graph(l_);
    fe::error_t e = build(*graph_, handle_);
    ASSERT_TRUE(e.is_good()) << e.get_message();
    workspace_bytes_ = workspace_size(*graph_);
  }
  std::unordered_map<int64_t, void*> pack(uint16_t* qkv) {
    uint16_t* d = dqkv_->get();
    return {{kQ, qkv},       {kK, qkv + C},          {kV, qkv + 2 * C},  {kScale, &scale_}, {kO, o_->get()},
            {kStats, stats_->get()}, {kDO, do_->get()}, {kDQ, d}, {kDK, d + C}, {kDV, d + 2 * C}};
  }

  const Layout l_{2, 2, 64, 32};
  const int64_t C = l_.C(), BT = l_.B * l_.T;
  float scale_ = 0.125f;
  std::unique_ptr<DevArray<uint16_t>> qkv_, o_, do_, dqkv_;
  std::unique_ptr<DevArray<float>> stats_;
  GraphP graph_;
  int64_t workspace_bytes_ = 0;
};

// The backward reads the statistics the forward wrote: a variant pack without them cannot run.
TEST_F(CudnnFrontendExecute, RefusesAVariantPackWithoutTheStatistics) {
  DevArray<uint8_t> ws(std::max<int64_t>(workspace_bytes_, 1));
  auto p = pack(qkv_->get());
  p.erase(kStats);
  EXPECT_TRUE(graph_->execute(handle_, p, ws.get()).is_bad());
}

// Q, K and V one bf16 element off their 16-byte alignment.
TEST_F(CudnnFrontendExecute, RefusesAMisalignedPointer) {
  DevArray<uint8_t> ws(std::max<int64_t>(workspace_bytes_, 1));
  DevArray<uint16_t> shifted(static_cast<size_t>(BT * 3 * C + 1));
  auto p = pack(shifted.get() + 1);
  EXPECT_TRUE(graph_->execute(handle_, p, ws.get()).is_bad());
#ifdef YUAN_EMU
  yuan::emu::take_reports();  // the frontend checks alignment first; the emulated cuDNN reports it when it sees it
#endif
}

#ifdef YUAN_EMU
// What cuDNN cannot see and the emulator can, from its allocations: a workspace smaller than the plan reported, and
// a tensor reaching past its allocation. Each is reported as well as refused.
TEST_F(CudnnFrontendExecute, RefusesAWorkspaceSmallerThanReported) {
  ASSERT_GT(workspace_bytes_, 4);
  DevArray<uint8_t> ws(static_cast<size_t>(workspace_bytes_ - 4));
  auto p = pack(qkv_->get());
  EXPECT_TRUE(graph_->execute(handle_, p, ws.get()).is_bad());
  EXPECT_GE(yuan::emu::take_reports().size(), 1u);
}

TEST_F(CudnnFrontendExecute, RefusesATensorOutsideItsAllocation) {
  DevArray<uint8_t> ws(std::max<int64_t>(workspace_bytes_, 1));
  DevArray<uint16_t> short_qkv(static_cast<size_t>(BT * 3 * C - 8));
  auto p = pack(short_qkv.get());
  EXPECT_TRUE(graph_->execute(handle_, p, ws.get()).is_bad());
  EXPECT_GE(yuan::emu::take_reports().size(), 1u);
}
#endif

}  // namespace
#endif  // YUAN_CUDNN
