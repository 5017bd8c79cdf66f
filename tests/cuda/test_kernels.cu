// Each CUDA kernel family against its CPU reference in src/ops, on random inputs rounded to bf16 first (so both
// sides compute from the same values). Tolerances (metric in gpu_test.h): bf16 outputs 1e-2 (one rounding is
// <= 2^-9 of the value, plus fp32 sums in another order); fp32 outputs of fp32 sums 1e-4 or tighter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "adamw_kernel.cuh"
#include "cast.cuh"
#include "classifier.cuh"
#include "encoder.cuh"
#include "gelu.cuh"
#include "gpu_test.h"
#ifdef YUAN_EMU
#include <cuda_emu.h>
#endif
#include "grad_norm.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "ops/adamw.h"
#include "ops/reference_ops.h"

namespace {

using namespace yuan::test;
using yuan::gpu::bf16;
namespace gpu = yuan::gpu;
namespace ops = yuan::ops;

bf16* B16(DevArray<uint16_t>& a) { return reinterpret_cast<bf16*>(a.get()); }

// The part of the vocabulary a rank's wte holds, and whether it adds the positions (tensor rank 0 only).
struct EncoderCase {
  int vocab_begin, vocab_rows;
  bool positions;
  int C;  // above 512, the wte backward's grid has a second dimension (128 threads of 4-float packs per block)
  const char* name;
};
class CudaEncoder : public testing::TestWithParam<EncoderCase> {};

TEST_P(CudaEncoder, ForwardAndDeterministicBackwardMatchCpu) {
  YUAN_REQUIRE_GPU();
  const EncoderCase k = GetParam();
  const int B = 3, T = 37, C = k.C, V = 20, stride = T + 1;  // V small: many repeated tokens
  std::vector<int32_t> tok(static_cast<size_t>(B) * stride);
  std::mt19937 gen(1);
  for (auto& t : tok) t = static_cast<int32_t>(gen() % V);
  const auto wte = round_bf16(randn(static_cast<size_t>(k.vocab_rows) * C, 0.5f, 2));
  const auto wpe = round_bf16(randn(static_cast<size_t>(T) * C, 0.5f, 3));
  DevArray<int32_t> d_tok(tok);
  DevArray<uint16_t> d_wte(to_bf16(wte)), d_wpe(to_bf16(wpe)), d_out(static_cast<size_t>(B) * T * C);
  gpu::encoder_forward(B16(d_out), d_tok.get(), B16(d_wte), k.positions ? B16(d_wpe) : nullptr, B, T, C, stride,
                       k.vocab_begin, k.vocab_rows, 0);
  std::vector<float> ref(static_cast<size_t>(B) * T * C);
  ops::encoder_forward(ref.data(), tok.data(), wte.data(), k.positions ? wpe.data() : nullptr, B, T, C, stride,
                       k.vocab_begin, k.vocab_rows);
  EXPECT_LT(rel_err(from_bf16(d_out.download()), ref), 4e-3) << "one bf16 rounding of the sum";

  const auto dout = randn(static_cast<size_t>(B) * T * C, 1.0f, 4);
  const auto dwte0 = randn(wte.size(), 1.0f, 5), dwpe0 = randn(wpe.size(), 1.0f, 6);  // backward adds to these
  auto dwte = dwte0, dwpe = dwpe0;
  ops::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, stride, k.vocab_begin,
                        k.vocab_rows);
  const std::vector<int32_t> groups = gpu::token_groups(tok.data(), B, T, stride);
  const gpu::TokenGroupRange held = gpu::token_group_range(groups, k.vocab_begin, k.vocab_rows);
  int expect_held = 0;  // distinct ids of the batch in the part
  for (int id = k.vocab_begin; id < k.vocab_begin + k.vocab_rows; id++)
    for (int b = 0; b < B; b++)
      if (std::count(tok.begin() + b * stride, tok.begin() + b * stride + T, id)) {
        expect_held++;
        break;
      }
  EXPECT_EQ(held.end - held.first, expect_held);
  DevArray<int32_t> d_groups(groups);
  DevArray<float> d_dout(dout);
  std::vector<float> first;
  for (int run = 0; run < 2; run++) {
    DevArray<float> d_dwte(dwte0), d_dwpe(dwpe0);
    gpu::encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_groups.get(), groups[0], held, k.vocab_begin,
                          B, T, C, 0);
    const auto got = d_dwte.download();
    EXPECT_LT(rel_err(got, dwte), 1e-5);
    EXPECT_LT(rel_err(d_dwpe.download(), dwpe), 1e-5) << "every rank adds to the positions' gradient";
    if (run == 0)
      first = got;
    else
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0) << "no atomics: same bits";
  }
}

// A part none of the batch's ids fall in makes the backward launch no wte block.
INSTANTIATE_TEST_SUITE_P(VocabularyParts, CudaEncoder,
                         testing::Values(EncoderCase{0, 20, true, 72, "Whole"},
                                         EncoderCase{0, 10, true, 72, "Rank0Of2"},
                                         EncoderCase{7, 6, false, 72, "MiddleWithoutPositions"},
                                         EncoderCase{20, 8, false, 72, "NoneOfTheIds"},
                                         EncoderCase{5, 5, false, 72, "Rank1Of4"},
                                         EncoderCase{0, 20, true, 648, "Wide"}),
                         [](const testing::TestParamInfo<EncoderCase>& p) { return std::string(p.param.name); });

TEST(CudaBiasResidual, MatchesCpu) {
  YUAN_REQUIRE_GPU();
  const int N = 67, C = 72;  // N * C / 8 packs is not a multiple of the block
  const auto out = round_bf16(randn(static_cast<size_t>(N) * C, 1.0f, 7));
  const auto bias = round_bf16(randn(C, 0.5f, 8)), res = round_bf16(randn(out.size(), 1.0f, 9));
  DevArray<uint16_t> d_out(to_bf16(out)), d_bias(to_bf16(bias)), d_res(to_bf16(res));
  gpu::bias_residual(B16(d_out), B16(d_bias), B16(d_res), N, C, 0);
  auto ref = out;
  ops::bias_residual_add(ref.data(), bias.data(), res.data(), N, C);
  EXPECT_LT(rel_err(from_bf16(d_out.download()), ref), 4e-3) << "one bf16 rounding of the sum";
}

// N = 67 rows gives the backward 3 blocks of 23 rows, the last short, and warps with a row fewer than others;
// 1001 gives 32 blocks. C is not a multiple of 256, so the warp loops' tails run; 1000 needs 8 KB slices, and
// spreads the reduction of the blocks' partials over several blocks.
class CudaLayerNorm : public testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CudaLayerNorm, ForwardAndBackwardMatchCpu) {
  YUAN_REQUIRE_GPU();
  const auto [N, C] = GetParam();
  const auto x = round_bf16(randn(static_cast<size_t>(N) * C, 2.0f, 10, 0.5f));
  const auto w = round_bf16(randn(C, 0.1f, 11, 1.0f)), b = round_bf16(randn(C, 0.1f, 12));
  DevArray<uint16_t> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(b)), d_out(x.size());
  DevArray<float> d_mean(N), d_rstd(N);
  gpu::layernorm_forward(B16(d_out), d_mean.get(), d_rstd.get(), B16(d_x), B16(d_w), B16(d_b), N, C, 0);
  std::vector<float> out(x.size()), mean(N), rstd(N);
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_LT(rel_err(from_bf16(d_out.download()), out), 1e-2);
  EXPECT_LT(rel_err(d_mean.download(), mean), 1e-5);
  EXPECT_LT(rel_err(d_rstd.download(), rstd), 1e-5);

  const auto dy = round_bf16(randn(x.size(), 1.0f, 13));
  auto dres = randn(x.size(), 1.0f, 14), dw = randn(C, 1.0f, 15), db = randn(C, 1.0f, 16);  // added to
  DevArray<uint16_t> d_dy(to_bf16(dy)), d_dres_bf16(x.size());
  DevArray<float> d_dres(dres), d_dw(dw), d_db(db), d_partials(gpu::layernorm_partials_size(C));
  gpu::layernorm_backward(d_dres.get(), B16(d_dres_bf16), d_dw.get(), d_db.get(), d_partials.get(), B16(d_dy),
                          B16(d_x), B16(d_w), d_mean.get(), d_rstd.get(), N, C, 0);
  ops::layernorm_backward(dres.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                          N, C);
  const auto got = d_dres.download();
  EXPECT_LT(rel_err(got, dres), 1e-5);
  EXPECT_LT(rel_err(from_bf16(d_dres_bf16.download()), got), 4e-3) << "dres_bf16 is dres rounded";
  EXPECT_LT(rel_err(d_dw.download(), dw), 1e-5);
  EXPECT_LT(rel_err(d_db.download(), db), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Rows, CudaLayerNorm,
                         testing::Values(std::tuple(67, 328), std::tuple(1001, 328), std::tuple(45, 1000)));

// Element counts of one pack, of packs that are not a multiple of the 256-thread block, and of more packs than
// one pass of the grid covers on the target device (its loop strides: 270,336 packs on the H100, docs/EMULATOR.md,
// "Test shapes"). DevArray has no slack: a pack read or written past the end is reported.
class CudaGelu : public testing::TestWithParam<size_t> {};

TEST_P(CudaGelu, ForwardAndBackwardMatchCpu) {
  YUAN_REQUIRE_GPU();
  const size_t n = GetParam();
  const auto x = round_bf16(randn(n, 2.0f, 20)), dy = round_bf16(randn(n, 1.0f, 21));
  DevArray<uint16_t> d_x(to_bf16(x)), d_dy(to_bf16(dy)), d_out(n), d_dx(n);
  gpu::gelu_forward(B16(d_out), B16(d_x), n, 0);
  gpu::gelu_backward(B16(d_dx), B16(d_x), B16(d_dy), n, 0);
  std::vector<float> out(n), dx(n, 0.0f);
  ops::gelu_forward(out.data(), x.data(), n);
  ops::gelu_backward(dx.data(), x.data(), dy.data(), n);
  EXPECT_LT(rel_err(from_bf16(d_out.download()), out), 1e-2);
  EXPECT_LT(rel_err(from_bf16(d_dx.download()), dx), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Packs, CudaGelu, testing::Values(8, 8 * 1001, 8 * 271200));

// One linear layer's forward and backward through every epilogue the backend uses.
struct MatmulCase {
  int N, C, OC, ld;  // ld: row stride of out / dout (> OC for the logits)
  bool bias, residual, gelu;
};

// How the GELU and bias-gradient epilogues run: fused into the GEMM; unfused because Matmul::fuse_epilogues is
// off; or unfused because cuBLASLt has no algorithm for them (the emulated library refuses them, as a GPU's may
// for some shapes), which is the path the program takes on such a GPU.
enum class Fusion { Fused, Unfused, Refused };

// Sets the emulated cuBLASLt's refusal for one scope (a GPU build has no switch: there, Refused runs as Fused).
class RefuseFusedEpilogues {
 public:
  explicit RefuseFusedEpilogues(bool on) : on_(on) {
#ifdef YUAN_EMU
    if (on_) yuan::emu::set_cublaslt_refuses_fused_epilogues(true);
#endif
  }
  ~RefuseFusedEpilogues() {
#ifdef YUAN_EMU
    if (on_) yuan::emu::set_cublaslt_refuses_fused_epilogues(false);
#endif
  }

 private:
  bool on_;
};

class CudaMatmul : public testing::TestWithParam<std::tuple<MatmulCase, Fusion>> {};

TEST_P(CudaMatmul, ForwardAndBackwardMatchCpu) {
  YUAN_REQUIRE_GPU();
  const auto [k, fusion] = GetParam();
  const RefuseFusedEpilogues refuse(fusion == Fusion::Refused);
  const size_t N = k.N, C = k.C, OC = k.OC, ld = k.ld;
  const auto inp = round_bf16(randn(N * C, 1.0f, 30)), w = round_bf16(randn(OC * C, 0.1f, 31));
  const auto bias = round_bf16(randn(OC, 0.5f, 32)), res = round_bf16(randn(N * OC, 1.0f, 33));
  std::vector<float> ref(N * OC);
  ops::matmul_forward(ref.data(), inp.data(), w.data(), k.bias ? bias.data() : nullptr, k.N, k.C, k.OC);
  if (k.residual)
    for (size_t i = 0; i < ref.size(); i++) ref[i] += res[i];
  std::vector<float> pre = ref;  // GELU input
  if (k.gelu) ops::gelu_forward(ref.data(), pre.data(), ref.size());

  DevArray<char> ws(gpu::Matmul::kWorkspaceBytes);
  DevArray<float> bias_scratch(OC);
  gpu::Matmul mm(ws.get(), bias_scratch.get(), OC);
  mm.fuse_epilogues = fusion != Fusion::Unfused;
  DevArray<uint16_t> d_inp(to_bf16(inp)), d_w(to_bf16(w)), d_bias(to_bf16(bias)), d_res(to_bf16(res));
  DevArray<uint16_t> d_out(N * ld), d_pre(N * OC);
  mm.forward(B16(d_out), B16(d_inp), B16(d_w), k.bias ? B16(d_bias) : nullptr, k.residual ? B16(d_res) : nullptr,
             k.gelu ? B16(d_pre) : nullptr, k.N, k.C, k.OC, k.ld, 0);
  const auto out_all = from_bf16(d_out.download());
  std::vector<float> out(N * OC);
  for (size_t i = 0; i < N; i++) std::copy_n(out_all.begin() + i * ld, OC, out.begin() + i * OC);
  EXPECT_LT(rel_err(out, ref), 1e-2) << "forward";
  if (k.gelu) {
    EXPECT_LT(rel_err(from_bf16(d_pre.download()), pre), 1e-2) << "GELU input kept for backward";
  }

  // Backward: dout in the [N, ld] layout; dw and dbias start random because they are added to.
  const auto dout = round_bf16(randn(N * OC, 1.0f, 34));
  std::vector<float> dout_ld(N * ld, 0.0f);
  for (size_t i = 0; i < N; i++) std::copy_n(dout.begin() + i * OC, OC, dout_ld.begin() + i * ld);
  const auto dw0 = randn(OC * C, 1.0f, 35), db0 = randn(OC, 1.0f, 36);
  auto dw = dw0, db = db0;
  std::vector<float> dinp(N * C, 0.0f);
  ops::matmul_backward(dinp.data(), dw.data(), k.bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(), k.N,
                       k.C, k.OC);
  DevArray<uint16_t> d_dout(to_bf16(dout_ld)), d_dinp(N * C);
  DevArray<float> d_dw(dw0), d_db(db0);  // the start values: the CPU reference has added to dw, db already
  // GELU backward pairs with an input whose size is the GEMM's C: use a layer whose input is the GELU output.
  if (k.gelu) {
    const auto pre_in = round_bf16(randn(N * C, 1.0f, 37));
    DevArray<uint16_t> d_pre_in(to_bf16(pre_in));
    std::vector<float> dx(N * C, 0.0f);
    ops::gelu_backward(dx.data(), pre_in.data(), dinp.data(), dx.size());
    dinp = dx;
    mm.backward(B16(d_dinp), d_dw.get(), k.bias ? d_db.get() : nullptr, B16(d_dout), B16(d_inp), B16(d_w),
                B16(d_pre_in), k.N, k.C, k.OC, k.ld, 0);
  } else {
    mm.backward(B16(d_dinp), d_dw.get(), k.bias ? d_db.get() : nullptr, B16(d_dout), B16(d_inp), B16(d_w), nullptr,
                k.N, k.C, k.OC, k.ld, 0);
  }
  std::vector<float> got_dw = d_dw.download(), ddw(dw.size()), ref_ddw(dw.size());
  for (size_t i = 0; i < dw.size(); i++) {  // compare the added part: the start values dwarf it otherwise
    ddw[i] = got_dw[i] - dw0[i];
    ref_ddw[i] = dw[i] - dw0[i];
  }
  EXPECT_LT(rel_err(from_bf16(d_dinp.download()), dinp), 1e-2) << "dinp";
  EXPECT_LT(rel_err(ddw, ref_ddw), 1e-4) << "dweight (fp32 sums of exact bf16 products)";
  if (k.bias) {
    std::vector<float> got = d_db.download(), d_got(OC), d_ref(OC);
    for (size_t i = 0; i < OC; i++) {
      d_got[i] = got[i] - db0[i];
      d_ref[i] = db[i] - db0[i];
    }
    EXPECT_LT(rel_err(d_got, d_ref), 1e-4) << "dbias";
  }
}

const MatmulCase kMatmulCases[] = {
    {200, 128, 384, 384, true, false, false},  // qkv: bias
    {200, 128, 128, 128, true, true, false},   // c_proj: + residual
    {200, 128, 512, 512, true, false, true},   // c_fc: GELU
    {37, 64, 97, 128, false, false, false},    // logits: odd V
    {1, 32, 96, 96, true, false, false},       // one row
    // Output widths that are not a multiple of the bias-gradient kernel's 32 columns a block, one above 512, and
    // a GELU layer whose sizes are no multiple of 32 either.
    {45, 64, 584, 584, true, false, false},
    {29, 40, 136, 136, true, false, true},
};
INSTANTIATE_TEST_SUITE_P(Epilogues, CudaMatmul,
                         testing::Combine(testing::ValuesIn(kMatmulCases),
                                          testing::Values(Fusion::Fused, Fusion::Unfused, Fusion::Refused)));

TEST(CudaClassifier, LossesAndGradientMatchCpu) {
  YUAN_REQUIRE_GPU();
  struct Case {
    int B, T, V;
  };
  for (Case k : {Case{2, 5, 1000}, Case{1, 3, 50257}, Case{3, 4, 13}}) {
    const int ld = (k.V + 63) / 64 * 64, stride = k.T + 1, N = k.B * k.T;
    const auto z = round_bf16(randn(static_cast<size_t>(N) * k.V, 2.0f, 40 + k.V));
    // A padding value that would dominate the softmax, and so change the loss, if the kernel did not mask it.
    const float pad = 30.0f;
    std::vector<float> z_ld(static_cast<size_t>(N) * ld, pad);
    for (int i = 0; i < N; i++) std::copy_n(z.begin() + static_cast<size_t>(i) * k.V, k.V, z_ld.begin() + static_cast<size_t>(i) * ld);
    std::vector<int32_t> tok(static_cast<size_t>(k.B) * stride);
    std::mt19937 gen(41);
    for (auto& t : tok) t = static_cast<int32_t>(gen() % k.V);
    const float scale = 0.37f;
    std::vector<float> ref = z, losses(N);
    ops::classifier_forward_backward(ref.data(), losses.data(), tok.data() + 1, k.B, k.T, k.V, stride, scale);
    DevArray<uint16_t> d_z(to_bf16(z_ld));
    DevArray<float> d_losses(N);
    DevArray<int32_t> d_tok(tok);
    gpu::classifier_forward_backward(B16(d_z), d_losses.get(), d_tok.get() + 1, k.B, k.T, k.V, ld, stride, scale, 0);
    EXPECT_LT(rel_err(d_losses.download(), losses), 1e-4) << "V=" << k.V;
    const auto got = from_bf16(d_z.download());
    std::vector<float> g(ref.size());
    const int zeroed = (k.V + 7) / 8 * 8;  // the classifier.cuh contract: zeros up to V rounded up to 8, then kept
    int bad_pad = 0;
    for (int i = 0; i < N; i++) {
      std::copy_n(got.begin() + static_cast<size_t>(i) * ld, k.V, g.begin() + static_cast<size_t>(i) * k.V);
      for (int c = k.V; c < ld; c++)
        if (got[static_cast<size_t>(i) * ld + c] != (c < zeroed ? 0.0f : pad)) bad_pad++;
    }
    EXPECT_LT(rel_err(g, ref), 1e-2) << "V=" << k.V;
    EXPECT_EQ(bad_pad, 0) << "V=" << k.V << ": padding columns [V, " << zeroed << ") must be zero, [" << zeroed
                          << ", ld) untouched";
  }
}

// The vocabulary-parallel passes, with the tensor ranks' parts of the logits side by side on one device and their
// all-reduces done on the host: every pass against its CPU twin on the same part, and the losses and gradient
// against the whole-row classifier, which is what the parts must add up to. The 4-rank case has logits near 30,
// as a trained model's are: a maximum taken wrongly (a sum of the ranks' maxima, ~4 x 30) then underflows every
// exp(z - max) to 0 in fp32 and the loss is infinite, where logits near 1 over 2 ranks would only shift the
// softmax by a few units, which it does not see.
TEST(CudaClassifier, VocabularyParallelMatchesCpu) {
  YUAN_REQUIRE_GPU();
  struct Case {
    int B, T;
    std::vector<int> parts;  // each rank's columns, in id order
    float mean;              // of the logits (their spread is 2)
  };
  for (const Case& k : {Case{2, 5, {333, 333, 334}, 0.0f}, Case{1, 3, {25128, 25129}, 0.0f}, Case{3, 4, {6, 7}, 0.0f},
                        Case{2, 5, {96, 101, 64, 139}, 30.0f}}) {
    int V = 0;
    for (int v : k.parts) V += v;
    const int stride = k.T + 1, N = k.B * k.T, R = static_cast<int>(k.parts.size());
    const auto z = round_bf16(randn(static_cast<size_t>(N) * V, 2.0f, 80 + V, k.mean));
    std::vector<int32_t> tok(static_cast<size_t>(k.B) * stride);
    std::mt19937 gen(81);
    for (auto& t : tok) t = static_cast<int32_t>(gen() % V);
    DevArray<int32_t> d_tok(tok);
    // A padding value that would dominate max and sum if it were read.
    const float scale = 0.37f, pad = k.mean + 30.0f;
    std::vector<float> whole = z, whole_losses(N);
    ops::classifier_forward_backward(whole.data(), whole_losses.data(), tok.data() + 1, k.B, k.T, V, stride, scale);

    // Each rank's part, padded to the backend's row stride, in bf16 on the device and fp32 on the host.
    std::vector<std::vector<float>> part(R);
    std::vector<std::unique_ptr<DevArray<uint16_t>>> d_part;
    std::vector<int> begin(R), ld(R);
    for (int r = 0, b = 0; r < R; b += k.parts[r], r++) {
      const int v = k.parts[r];
      begin[r] = b, ld[r] = (v + 63) / 64 * 64;
      part[r].resize(static_cast<size_t>(N) * v);
      std::vector<float> padded(static_cast<size_t>(N) * ld[r], pad);
      for (int i = 0; i < N; i++) {
        std::copy_n(z.begin() + static_cast<size_t>(i) * V + b, v, part[r].begin() + static_cast<size_t>(i) * v);
        std::copy_n(z.begin() + static_cast<size_t>(i) * V + b, v, padded.begin() + static_cast<size_t>(i) * ld[r]);
      }
      d_part.push_back(std::make_unique<DevArray<uint16_t>>(to_bf16(padded)));
    }

    // Pass 1, then the MAX all-reduce.
    std::vector<float> row_max(N, -INFINITY), ref(N);
    for (int r = 0; r < R; r++) {
      DevArray<float> d_max(N);
      gpu::classifier_row_max(B16(*d_part[r]), d_max.get(), N, k.parts[r], ld[r], 0);
      ops::classifier_row_max(part[r].data(), ref.data(), N, k.parts[r]);
      const auto got = d_max.download();
      EXPECT_EQ(got, ref) << "rank " << r << " of V=" << V << ": a maximum is exact";
      for (int i = 0; i < N; i++) row_max[i] = std::max(row_max[i], got[i]);
    }
    // Pass 2, then the SUM all-reduce.
    DevArray<float> d_row_max(row_max);
    std::vector<float> sums(2 * static_cast<size_t>(N), 0.0f), ref_sums(sums.size());
    for (int r = 0; r < R; r++) {
      DevArray<float> d_sums(sums.size());
      gpu::classifier_row_sums(B16(*d_part[r]), d_row_max.get(), d_tok.get() + 1, k.B, k.T, k.parts[r], ld[r],
                               stride, begin[r], d_sums.get(), 0);
      ops::classifier_row_sums(part[r].data(), row_max.data(), tok.data() + 1, k.B, k.T, k.parts[r], stride,
                               begin[r], ref_sums.data());
      const auto got = d_sums.download();
      EXPECT_LT(rel_err(got.data(), ref_sums.data(), N), 1e-5) << "rank " << r << " of V=" << V << ": sums of exp";
      EXPECT_EQ(std::vector<float>(got.begin() + N, got.end()), std::vector<float>(ref_sums.begin() + N, ref_sums.end()))
          << "rank " << r << " of V=" << V << ": the target's logit where the rank holds it, else 0";
      for (size_t i = 0; i < sums.size(); i++) sums[i] += got[i];
    }
    // Pass 3: evaluation (no gradient) leaves the logits as they were; training writes the gradient.
    DevArray<float> d_sums(sums);
    for (float dscale : {0.0f, scale}) {
      for (int r = 0; r < R; r++) {
        const int v = k.parts[r];
        DevArray<float> d_losses(N);
        const auto before = d_part[r]->download();
        gpu::classifier_parallel_finish(B16(*d_part[r]), d_losses.get(), d_row_max.get(), d_sums.get(),
                                        d_tok.get() + 1, k.B, k.T, v, ld[r], stride, begin[r], dscale, 0);
        EXPECT_LT(rel_err(d_losses.download(), whole_losses), 1e-4) << "rank " << r << " of V=" << V;
        const auto after = d_part[r]->download();
        if (dscale == 0.0f) {
          EXPECT_EQ(after, before) << "rank " << r << " of V=" << V << ": the logits are kept without a gradient";
          continue;
        }
        const auto got = from_bf16(after);
        std::vector<float> g(static_cast<size_t>(N) * v), ref_g(g.size());
        const int zeroed = (v + 7) / 8 * 8;
        int bad_pad = 0;
        for (int i = 0; i < N; i++) {
          std::copy_n(got.begin() + static_cast<size_t>(i) * ld[r], v, g.begin() + static_cast<size_t>(i) * v);
          std::copy_n(whole.begin() + static_cast<size_t>(i) * V + begin[r], v,
                      ref_g.begin() + static_cast<size_t>(i) * v);
          for (int c = v; c < ld[r]; c++)
            if (got[static_cast<size_t>(i) * ld[r] + c] != (c < zeroed ? 0.0f : pad)) bad_pad++;
        }
        EXPECT_LT(rel_err(g, ref_g), 1e-2) << "rank " << r << " of V=" << V;
        EXPECT_EQ(bad_pad, 0) << "rank " << r << " of V=" << V << ": padding as classifier.cuh says";
      }
    }
  }
}

TEST(CudaCast, RoundsLikeTheHostAtAnyOffset) {
  YUAN_REQUIRE_GPU();
  const size_t n = 100003;
  auto x = randn(n, 3.0f, 50);
  x[7] = 1.0f + 1.0f / 256;  // exactly halfway between two bf16 values: ties to even
  DevArray<float> d_x(x), d_back(n);
  DevArray<uint16_t> d_b(n);
  gpu::f32_to_bf16(reinterpret_cast<bf16*>(d_b.get() + 1), d_x.get() + 1, n - 2, 0);
  const auto bits = d_b.download();
  for (size_t i = 1; i + 1 < n; i++) ASSERT_EQ(bits[i], yuan::f32_to_bf16(x[i])) << "element " << i;
  EXPECT_EQ(bits[0], 0xffff) << "wrote before the range";
  EXPECT_EQ(bits[n - 1], 0xffff) << "wrote past the range";
  gpu::bf16_to_f32(d_back.get(), B16(d_b), n, 0);
  const auto back = d_back.download();
  for (size_t i = 1; i + 1 < n; i++) ASSERT_EQ(back[i], yuan::bf16_to_f32(bits[i]));
}

TEST(CudaGradNorm, SumOfSquaresMatchesCpuAndRepeats) {
  YUAN_REQUIRE_GPU();
  const size_t n = 1000003;
  const auto x = randn(n, 1e-2f, 60);
  DevArray<float> d_x(x);
  DevArray<double> partials(gpu::sum_squares_partials_size());
  const double got = gpu::sum_squares(d_x.get(), n, partials.get(), 0), ref = ops::sum_squares(x.data(), n);
  EXPECT_NEAR(got, ref, 1e-12 * ref) << "double sums in another order";
  EXPECT_EQ(gpu::sum_squares(d_x.get(), n, partials.get(), 0), got) << "not the same bits on a second run";
}

TEST(CudaAdamW, StepMatchesCpu) {
  YUAN_REQUIRE_GPU();
  const size_t n = 10007;
  auto p = randn(n, 0.5f, 70), m = randn(n, 0.01f, 71), v = randn(n, 0.01f, 72), g = randn(n, 0.1f, 73);
  for (float& x : v) x = x * x;
  ops::AdamWHyper h;
  h.lr = 3e-4;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.t = 3;
  h.grad_scale = 0.7;
  DevArray<float> d_p(p), d_m(m), d_v(v), d_g(g);
  DevArray<uint16_t> d_pb(n);
  gpu::adamw_update(d_p.get(), d_m.get(), d_v.get(), d_g.get(), B16(d_pb), n, h, 0);
  ops::adamw_update(p.data(), m.data(), v.data(), g.data(), nullptr, n, h);
  const auto got = d_p.download();
  // fp32 on both sides; only FMA contraction differs.
  EXPECT_LT(rel_err(got, p), 1e-6);
  EXPECT_LT(rel_err(d_m.download(), m), 1e-6);
  EXPECT_LT(rel_err(d_v.download(), v), 1e-6);
  const auto bits = d_pb.download();
  for (size_t i = 0; i < n; i++) ASSERT_EQ(bits[i], yuan::f32_to_bf16(got[i])) << "bf16 weight " << i;
}

}  // namespace
