// Linear layers on cuBLASLt (CPU twin: src/ops/matmul.cpp): out = inp @ w^T + bias, w stored [OC, C].
// bf16 operands, fp32 accumulation and scaling (CUBLAS_COMPUTE_32F). A row-major [rows, cols] matrix is a
// column-major [cols, rows] one, so in cuBLAS's column-major terms (w is [C, OC], inp [C, N], dout [OC, N]):
//   forward   out [OC, N]   = w^T @ inp                               transa=T, transb=N
//   dinp      dinp [C, N]   = w @ dout                                transa=N, transb=N
//   dweight   dw [C, OC]   += inp @ dout^T   (fp32 C = D, beta = 1)   transa=N, transb=T
// What the epilogues fuse: the bias (BIAS), the residual add of the following LayerNorm's input (the C operand
// with beta = 1, C != D), the MLP's GELU with its input kept for backward (GELU_AUX_BIAS), GELU's backward on
// the input gradient (DGELU, reading that kept input), and the bias gradient as the column sums of dout
// (BGRADB). cuBLASLt writes a bias gradient instead of adding it, so it lands in a scratch vector first.
// cuBLASLt has no algorithm for some shapes with the GELU and bias-gradient epilogues, so each of those has an
// unfused fallback: the plain GEMM, then gelu.cu or bias_backward_kernel.
#include <algorithm>

#include "gelu.cuh"
#include "matmul.cuh"

namespace yuan::gpu {

struct Matmul::Call {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  const void* C = nullptr;  // null: C = D (only read when beta != 0)
  int64_t ldc = 0;
  void* D = nullptr;
  int64_t ldd = 0;
  cudaDataType_t cd_type = CUDA_R_16BF;  // C and D
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // bias (read) or bias gradient (written)
  const void* aux = nullptr;   // GELU input: written by GELU_AUX_BIAS, read by DGELU
  int64_t ld_aux = 0;
  float beta = 0;
};

// A plan per shape, epilogue and pointer alignment: cuBLASLt's heuristic depends on all of them (the default
// preference assumes 256-byte aligned operands, which parameter tensors inside the flat buffer are not).
struct Matmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

namespace {

int64_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return u == 0 ? 256 : static_cast<int64_t>(std::min<uintptr_t>(256, u & (~u + 1)));
}

bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool has_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU; }

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "other";
  }
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)));
}

__global__ void add_kernel(float* dst, const float* src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

constexpr int kBiasWarps = 32;

// dbias[oc] += sum over rows of dout[n * ld + oc]. A block owns one warp-wide strip of columns, so each row's read
// is contiguous; its warps take rows in turn and their sums are added in warp order, with no atomics, so the
// result is the same bits every run.
__global__ void __launch_bounds__(kBiasWarps * kWarpSize)
    bias_backward_kernel(float* dbias, const bf16* dout, int N, int OC, int64_t ld) {
  __shared__ float part[kBiasWarps][kWarpSize];
  const int oc = blockIdx.x * kWarpSize + threadIdx.x;
  float sum = 0;
  if (oc < OC)
    for (int n = threadIdx.y; n < N; n += kBiasWarps) sum += __bfloat162float(dout[n * ld + oc]);
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || oc >= OC) return;
  for (int w = 1; w < kBiasWarps; w++) sum += part[w][threadIdx.x];
  dbias[oc] += sum;
}

}  // namespace

Matmul::Matmul(void* workspace, float* bias_scratch, size_t bias_scratch_count)
    : workspace_(workspace), bias_scratch_(bias_scratch), bias_scratch_count_(bias_scratch_count) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
}

Matmul::~Matmul() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

Matmul::Plan& Matmul::plan(const Call& c) {
  // The C layout's leading dimension, not c.ldc: a null C is read through D's.
  const int64_t ldc = c.C ? c.ldc : c.ldd;
  std::vector<int64_t> key = {c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, ldc, c.ldd, c.cd_type, c.epilogue, c.ld_aux,
                              alignment(c.A), alignment(c.B), alignment(c.C ? c.C : c.D), alignment(c.D),
                              alignment(c.bias), alignment(c.aux)};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (slot) return *slot;
  auto p = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(c.ta));
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(c.tb));
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(c.epilogue));
  // The heuristic reads the bias and aux pointers' alignment, so the first call's pointers go in now; the key
  // holds their alignment, and later calls only swap the pointers.
  if (has_bias(c.epilogue)) set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  if (has_aux(c.epilogue)) {
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.ld_aux);
  }
  const bool a_t = c.ta == CUBLAS_OP_T, b_t = c.tb == CUBLAS_OP_T;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, a_t ? c.k : c.m, a_t ? c.m : c.k, c.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, b_t ? c.n : c.k, b_t ? c.k : c.n, c.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, c.cd_type, c.m, c.n, ldc));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, c.cd_type, c.m, c.n, c.ldd));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t align[4] = {static_cast<uint32_t>(key[12]), static_cast<uint32_t>(key[13]),
                             static_cast<uint32_t>(key[14]), static_cast<uint32_t>(key[15])};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof(align[i])));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // cuBLASLt says "no algorithm" with NOT_SUPPORTED rather than found == 0; run() must return false for it so
  // that the fused epilogues fall back.
  if (heuristic != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(heuristic);
  p->ok = heuristic == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p->ok) p->algo = result.algo;
  slot = std::move(p);
  return *slot;
}

bool Matmul::run(const Call& c, cudaStream_t s) {
  Plan& p = plan(c);
  if (!p.ok) return false;
  if (has_bias(c.epilogue)) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  if (has_aux(c.epilogue)) set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
  const float alpha = 1.0f;
  // cuBLASLt picks the kernel: the call is what the kernel account times (the op's shape names the epilogues, and
  // an unfused fallback's kernel shows beside it).
  timed("cublasLt gemm", s, [&] {
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, c.A, p.a, c.B, p.b, &c.beta, c.C ? c.C : c.D, p.c, c.D,
                                p.d, &p.algo, workspace_, kWorkspaceBytes, s));
  });
  return true;
}

// A plain or bias-only GEMM that cuBLASLt cannot run is a shape or alignment this backend should never produce.
#define RUN_OR_THROW(call_, s_)                                                                                    \
  YUAN_CHECK(run(call_, s_), "cuBLASLt has no algorithm for a %dx%dx%d GEMM (trans %d%d, epilogue %s, lda %lld, " \
             "ldb %lld, ldd %lld)", (call_).m, (call_).n, (call_).k, (call_).ta, (call_).tb,                      \
             epilogue_name((call_).epilogue), static_cast<long long>((call_).lda),                                 \
             static_cast<long long>((call_).ldb), static_cast<long long>((call_).ldd))

void Matmul::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, const bf16* residual,
                     bf16* pre_gelu, int N, int C, int OC, int ld_out, cudaStream_t s) {
  Call c;
  c.ta = CUBLAS_OP_T;
  c.tb = CUBLAS_OP_N;
  c.m = OC, c.n = N, c.k = C;
  c.A = w, c.lda = C;
  c.B = inp, c.ldb = C;
  c.C = residual, c.ldc = OC, c.beta = residual ? 1.0f : 0.0f;
  c.D = out, c.ldd = ld_out;
  c.bias = bias;
  c.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (!pre_gelu) {
    RUN_OR_THROW(c, s);
    return;
  }
  YUAN_CHECK(bias && !residual && ld_out == OC, "matmul: the GELU epilogue takes a bias, no residual, dense output");
  Call g = c;
  g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g.aux = pre_gelu, g.ld_aux = OC;
  if (fuse_epilogues && run(g, s)) return;
  c.D = pre_gelu;  // unfused: bias epilogue into the GELU input, then gelu.cu
  RUN_OR_THROW(c, s);
  gelu_forward(out, pre_gelu, static_cast<size_t>(N) * OC, s);
}

void Matmul::backward(bf16* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp, const bf16* w,
                      const bf16* pre_gelu, int N, int C, int OC, int ld_dout, cudaStream_t s) {
  Call d;
  d.ta = CUBLAS_OP_N;
  d.tb = CUBLAS_OP_N;
  d.m = C, d.n = N, d.k = OC;
  d.A = w, d.lda = C;
  d.B = dout, d.ldb = ld_dout;
  d.D = dinp, d.ldd = C;
  bool fused = false;
  if (pre_gelu && fuse_epilogues) {
    Call g = d;
    g.epilogue = CUBLASLT_EPILOGUE_DGELU;
    g.aux = pre_gelu, g.ld_aux = C;
    fused = run(g, s);
  }
  if (!fused) {
    RUN_OR_THROW(d, s);
    if (pre_gelu) gelu_backward(dinp, pre_gelu, dinp, static_cast<size_t>(N) * C, s);
  }

  Call g;
  g.ta = CUBLAS_OP_N;
  g.tb = CUBLAS_OP_T;
  g.m = C, g.n = OC, g.k = N;
  g.A = inp, g.lda = C;
  g.B = dout, g.ldb = ld_dout;
  g.C = dw, g.ldc = C, g.beta = 1.0f;
  g.D = dw, g.ldd = C;
  g.cd_type = CUDA_R_32F;
  if (dbias && fuse_epilogues) {
    YUAN_CHECK(static_cast<size_t>(OC) <= bias_scratch_count_, "matmul: bias gradient of %d > scratch of %zu", OC,
               bias_scratch_count_);
    Call b = g;
    b.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    b.bias = bias_scratch_;
    if (run(b, s)) {
      launch(add_kernel, ceil_div(OC, 256), 256, 0, s, dbias, bias_scratch_, OC);
      return;
    }
  }
  RUN_OR_THROW(g, s);
  if (dbias) {
    launch(bias_backward_kernel, ceil_div(OC, kWarpSize), dim3(kWarpSize, kBiasWarps), 0, s, dbias, dout, N, OC,
           ld_dout);
  }
}

}  // namespace yuan::gpu
