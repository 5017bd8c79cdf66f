// cuBLASLt in the emulator: the descriptors hold what the library reads, the heuristic checks the problem as the
// library does and hands out one algorithm that remembers the problem and the alignments it was chosen for, and
// cublasLtMatmul runs a reference GEMM over the same descriptors on the stream, so that a wrong transpose, leading
// dimension, batch stride or epilogue argument gives a wrong result here as on a GPU (or the error a GPU gives).
//
// Semantics (cuBLASLt documentation, column-major matrices, element (i, j) of a rows x cols layout at i + j * ld):
//   D = epilogue(alpha * op(A) op(B) + beta * C + bias), op(A) m x k, op(B) k x n, C and D m x n; C is not read
//   when beta is 0; C and D may be the same memory only with the same layout.
//   BIAS adds bias[i] (a vector of D's rows, D's type unless BIAS_DATA_TYPE says otherwise); GELU applies the tanh
//   GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and with AUX stores its input in the aux matrix (m x n,
//   leading dimension AUX_LD, a multiple of 8, D's type); DGELU multiplies by GELU's derivative at the aux matrix;
//   BGRADA / BGRADB write (not add) the bias gradient, the sums of op(A) over k (m values) / of op(B) over k (n
//   values); DGELU_BGRAD the row sums of its output.
// Products of bf16 values are exact in fp32 and summed in fp32 in k order (CUBLAS_COMPUTE_32F); a GPU's
// algorithms sum in other orders, so results agree to fp32 rounding, not bit for bit.
#include <cublasLt.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "emulator.h"

struct cublasLtContext {};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  int32_t bias_type = -1;
  const void* aux = nullptr;
  int64_t aux_ld = 0, aux_batch_stride = 0;
  int32_t aux_type = -1;
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
  int64_t batch_stride = 0;  // elements
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // the documented default: every pointer 256-byte aligned
};

namespace yuan::emu {
namespace {

constexpr uint64_t kAlgoMagic = 0x79756a6e656d75ull;

std::map<int, std::string>& messages() {  // by status: the latest report that returned it
  static auto* m = new std::map<int, std::string>;
  return *m;
}

cublasStatus_t fail(cublasStatus_t s, const std::string& what) {
  report(Check::Library, Where{}, 0, "cuBLASLt: " + what, false, cudaErrorInvalidValue);
  messages()[s] = "cuBLASLt (emulated): " + what;
  return s;
}

size_t type_size(int t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_32F ? 4 : 0; }
const char* type_name(int t) { return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_32F ? "f32" : "unmodelled type"; }

float load(const void* p, int type, size_t i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p)[i];
  uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void store(void* p, int type, size_t i, float v) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    u = 0x7fffu << 16;
  else
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even, as the GPU's conversion
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x))); }
float gelu_grad(float x) {
  const float th = std::tanh(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

bool has(uint32_t epilogue, uint32_t bit) { return (epilogue & bit) == bit; }
bool modelled(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU: case CUBLASLT_EPILOGUE_DGELU_BGRAD: case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB:
      return true;
  }
  return false;
}
// The epilogues cuBLASLt may have no algorithm for (all but none and BIAS); see set_cublaslt_refuses_fused_epilogues.
bool fused(uint32_t e) { return e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS; }
bool& refuse_fused() {
  static bool refuse = [] {
    const char* v = std::getenv("YUAN_EMU_CUBLASLT_NO_FUSED");
    return v && std::strcmp(v, "1") == 0;
  }();
  return refuse;
}
bool reads_bias(uint32_t e) { return has(e, CUBLASLT_EPILOGUE_BIAS) && !has(e, CUBLASLT_EPILOGUE_DGELU); }
bool writes_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool gelu_forward(uint32_t e) { return has(e, CUBLASLT_EPILOGUE_GELU); }
bool writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool reads_aux(uint32_t e) { return has(e, CUBLASLT_EPILOGUE_DGELU); }

// The GEMM's shape and types, checked against each other; what the algorithm remembers.
struct Problem {
  uint64_t m = 0, n = 0, k = 0;
  std::string error;  // empty: consistent
};

Problem shape(const cublasLtMatmulDescOpaque_t& d, const cublasLtMatrixLayoutOpaque_t& a,
              const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
              const cublasLtMatrixLayoutOpaque_t& dd) {
  Problem p;
  auto bad = [&](std::string e) {
    p.error = std::move(e);
    return p;
  };
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F)
    return bad(format("compute type %d / scale type %d: only CUBLAS_COMPUTE_32F with CUDA_R_32F scaling is modelled",
                      d.compute, d.scale));
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return bad("only host alpha and beta are modelled");
  if (d.transc != CUBLAS_OP_N) return bad("TRANSC must be CUBLAS_OP_N");
  for (int t : {d.transa, d.transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T) return bad(format("transpose %d: only N and T are modelled", t));
  if (!modelled(d.epilogue)) return bad(format("epilogue %u is not modelled", d.epilogue));
  for (const auto* l : {&a, &b, &c, &dd}) {
    if (l->order != CUBLASLT_ORDER_COL) return bad("only column-major (CUBLASLT_ORDER_COL) layouts are modelled");
    if (!type_size(l->type) || l->type == CUDA_R_16F) return bad(format("matrix type %d is not modelled", l->type));
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(l->rows, 1)))
      return bad(format("leading dimension %lld below the %llu rows", static_cast<long long>(l->ld),
                        static_cast<unsigned long long>(l->rows)));
  }
  if (a.type != b.type) return bad(format("A is %s, B %s", type_name(a.type), type_name(b.type)));
  if (c.type != dd.type) return bad(format("C is %s, D %s", type_name(c.type), type_name(dd.type)));
  const bool ta = d.transa == CUBLAS_OP_T, tb = d.transb == CUBLAS_OP_T;
  p.m = dd.rows, p.n = dd.cols, p.k = ta ? a.rows : a.cols;
  const uint64_t am = ta ? a.cols : a.rows, bk = tb ? b.cols : b.rows, bn = tb ? b.rows : b.cols;
  if (am != p.m || bk != p.k || bn != p.n || c.rows != p.m || c.cols != p.n)
    return bad(format("op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu do not make a GEMM (trans %s%s)",
                      (unsigned long long)am, (unsigned long long)p.k, (unsigned long long)bk,
                      (unsigned long long)bn, (unsigned long long)c.rows, (unsigned long long)c.cols,
                      (unsigned long long)p.m, (unsigned long long)p.n, ta ? "T" : "N", tb ? "T" : "N"));
  if (a.batch != dd.batch || b.batch != dd.batch || c.batch != dd.batch)
    return bad(format("batch counts A %d, B %d, C %d, D %d differ", a.batch, b.batch, c.batch, dd.batch));
  const int aux_type = d.aux_type < 0 ? dd.type : d.aux_type, bias_type = d.bias_type < 0 ? dd.type : d.bias_type;
  if (aux_type != dd.type || bias_type != dd.type)
    return bad("bias and aux types other than D's are not modelled");
  if ((writes_aux(d.epilogue) || reads_aux(d.epilogue)) &&
      (d.aux_ld < static_cast<int64_t>(p.m) || d.aux_ld % 8 != 0))
    return bad(format("EPILOGUE_AUX_LD %lld: must be at least the %llu rows of D and a multiple of 8",
                      static_cast<long long>(d.aux_ld), (unsigned long long)p.m));
  return p;
}

uint64_t fingerprint(const cublasLtMatmulDescOpaque_t& d, const cublasLtMatrixLayoutOpaque_t* const (&l)[4]) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(d.transa), mix(d.transb), mix(d.epilogue), mix(static_cast<uint64_t>(d.aux_ld));
  for (const auto* x : l) mix(x->type), mix(x->rows), mix(x->cols), mix(static_cast<uint64_t>(x->ld)), mix(x->batch);
  return h;
}

uint32_t alignment_of(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return u == 0 ? 256 : static_cast<uint32_t>(std::min<uintptr_t>(256, u & (~u + 1)));
}

// Bytes [first, last) a rows x cols layout with leading dimension ld covers, per batch.
size_t span_elems(uint64_t rows, uint64_t cols, int64_t ld) { return rows && cols ? (cols - 1) * ld + rows : 0; }

// Checks that the matrix lies in one live device allocation and, read, is initialised in every element used.
std::string check_matrix(const char* name, const void* p, int type, uint64_t rows, uint64_t cols, int64_t ld,
                         int batch, int64_t batch_stride, bool read) {
  const size_t es = type_size(type);
  for (int b = 0; b < batch; b++) {
    const char* base = static_cast<const char*>(p) + b * batch_stride * static_cast<int64_t>(es);
    std::string bad = check_range(Space::Device, base, span_elems(rows, cols, ld) * es, false);
    for (uint64_t j = 0; bad.empty() && read && j < cols; j++) {
      bad = check_range(Space::Device, base + j * ld * es, rows * es, true);
      note_access(base + j * ld * es, rows * es, false);  // read checks happen as the GEMM runs: it reads them
    }
    if (!bad.empty()) return format("%s (%llux%llu, ld %lld, batch %d): %s", name, (unsigned long long)rows,
                                    (unsigned long long)cols, static_cast<long long>(ld), b, bad.c_str());
  }
  return {};
}

// What the GEMM wrote: initialised, and its write for the happens-before check.
void written(const void* p, size_t n) {
  mark_initialised(p, n);
  note_access(p, n, true);
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return an && bn && x < y + bn && y < x + an;
}

struct Gemm {
  cublasLtMatmulDescOpaque_t d;
  cublasLtMatrixLayoutOpaque_t a, b, c, dd;
  Problem p;
  float alpha, beta;
  const void *A, *B, *C;
  void* D;

  // The inputs, initialised in every element the GEMM reads, checked when it runs (after the stream's earlier work,
  // which may be what writes them).
  std::string uninitialised() const {
    const uint32_t e = d.epilogue;
    std::string bad = check_matrix("A", A, a.type, a.rows, a.cols, a.ld, a.batch, a.batch_stride, true);
    if (bad.empty()) bad = check_matrix("B", B, b.type, b.rows, b.cols, b.ld, b.batch, b.batch_stride, true);
    if (bad.empty() && beta != 0.0f)
      bad = check_matrix("C", C, c.type, c.rows, c.cols, c.ld, c.batch, c.batch_stride, true);
    if (bad.empty() && reads_bias(e))
      bad = check_matrix("bias", d.bias, dd.type, p.m, 1, p.m, dd.batch, d.bias_batch_stride, true);
    if (bad.empty() && reads_aux(e))
      bad = check_matrix("aux", d.aux, dd.type, p.m, p.n, d.aux_ld, dd.batch, d.aux_batch_stride, true);
    return bad;
  }

  void run() const {
    const std::string bad = uninitialised();
    if (!bad.empty()) {
      report(Check::Uninitialised, Where{"cublasLtMatmul (emulated)", {}, {}}, 0, "the GEMM reads " + bad, true,
             cudaErrorLaunchFailure);
      return;
    }
    const bool ta = d.transa == CUBLAS_OP_T, tb = d.transb == CUBLAS_OP_T;
    const size_t m = p.m, n = p.n, k = p.k;
    // op(A) by rows and op(B) by rows of k, so that the inner loop runs over n contiguous columns; each element is
    // still one sum in k order, whichever thread computes its row and however wide the vectors of columns are.
    std::vector<float> opa(m * k), opb(k * n), out(m * n);
    for (int batch = 0; batch < dd.batch; batch++) {
      const size_t oa = batch * a.batch_stride, ob = batch * b.batch_stride, oc = batch * c.batch_stride,
                   od = batch * dd.batch_stride;
      for (size_t i = 0; i < m; i++)
        for (size_t kk = 0; kk < k; kk++) opa[i * k + kk] = load(A, a.type, oa + (ta ? kk + i * a.ld : i + kk * a.ld));
      for (size_t kk = 0; kk < k; kk++)
        for (size_t j = 0; j < n; j++) opb[kk * n + j] = load(B, b.type, ob + (tb ? j + kk * b.ld : kk + j * b.ld));
      const char* aux = static_cast<const char*>(d.aux) + batch * d.aux_batch_stride * type_size(dd.type);
      char* bias = static_cast<char*>(const_cast<void*>(d.bias)) + batch * d.bias_batch_stride * type_size(dd.type);
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < m; i++) {
        std::vector<float> row(n, 0.0f);
        for (size_t kk = 0; kk < k; kk++) {
          const float x = opa[i * k + kk];
          const float* bk = &opb[kk * n];
          float* r = row.data();
#pragma omp simd
          for (size_t j = 0; j < n; j++) r[j] += x * bk[j];
        }
        for (size_t j = 0; j < n; j++) {
          float v = alpha * row[j];
          if (beta != 0.0f) v += beta * load(C, c.type, oc + i + j * c.ld);
          if (reads_bias(d.epilogue)) v += load(bias, dd.type, i);
          if (gelu_forward(d.epilogue)) {
            if (writes_aux(d.epilogue)) store(const_cast<char*>(aux), dd.type, i + j * d.aux_ld, v);
            v = gelu(v);
          } else if (reads_aux(d.epilogue)) {
            v *= gelu_grad(load(aux, dd.type, i + j * d.aux_ld));
          }
          out[i + j * m] = v;
          store(D, dd.type, od + i + j * dd.ld, v);
        }
      }
      if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA || d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)
        for (size_t i = 0; i < m; i++) {
          float s = 0;
          if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA)
            for (size_t kk = 0; kk < k; kk++) s += opa[i * k + kk];
          else
            for (size_t j = 0; j < n; j++) s += out[i + j * m];
          store(bias, dd.type, i, s);
        }
      if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB)
        for (size_t j = 0; j < n; j++) {
          float s = 0;
          for (size_t kk = 0; kk < k; kk++) s += opb[kk * n + j];
          store(bias, dd.type, j, s);
        }
      // What the GEMM wrote is initialised now.
      const size_t es = type_size(dd.type);
      for (size_t j = 0; j < n; j++) written(static_cast<char*>(D) + (od + j * dd.ld) * es, m * es);
      if (writes_aux(d.epilogue))
        for (size_t j = 0; j < n; j++) written(aux + j * d.aux_ld * es, m * es);
      if (writes_bias(d.epilogue)) written(bias, (d.epilogue == CUBLASLT_EPILOGUE_BGRADB ? n : m) * es);
    }
  }
};

template <typename T>
cublasStatus_t set(T& field, const void* buf, size_t size, const char* name) {
  if (size != sizeof(T)) return fail(CUBLAS_STATUS_INVALID_VALUE, format("%s takes %zu bytes, got %zu", name, sizeof(T), size));
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace yuan::emu

using namespace yuan::emu;

const char* cublasGetStatusString(cublasStatus_t status) {
  Lock lock(mutex());
  const auto it = messages().find(status);
  if (it != messages().end()) return it->second.c_str();
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "cuBLAS error";
  }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Lock lock(mutex());
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set(d->compute, buf, size, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set(d->scale, buf, size, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set(d->pointer_mode, buf, size, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(d->transa, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(d->transb, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_TRANSC: return set(d->transc, buf, size, "TRANSC");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(d->epilogue, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set(d->bias_batch_stride, buf, size, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(d->bias_type, buf, size, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set(d->aux, buf, size, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set(d->aux_ld, buf, size, "EPILOGUE_AUX_LD");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return set(d->aux_batch_stride, buf, size, "EPILOGUE_AUX_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set(d->aux_type, buf, size, "EPILOGUE_AUX_DATA_TYPE");
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED, format("matmul descriptor attribute %d is not modelled", attr));
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Lock lock(mutex());
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set(l->type, buf, size, "TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set(l->order, buf, size, "ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set(l->rows, buf, size, "ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set(l->cols, buf, size, "COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return set(l->ld, buf, size, "LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(l->batch, buf, size, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set(l->batch_stride, buf, size, "STRIDED_BATCH_OFFSET");
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED, format("matrix layout attribute %d is not modelled", attr));
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  Lock lock(mutex());
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
      uint32_t mode;
      return set(mode, buf, size, "SEARCH_MODE");
    }
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(p->max_workspace, buf, size, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(p->align[0], buf, size, "MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(p->align[1], buf, size, "MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(p->align[2], buf, size, "MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(p->align[3], buf, size, "MIN_ALIGNMENT_D_BYTES");
  }
  return fail(CUBLAS_STATUS_NOT_SUPPORTED, format("preference attribute %d is not modelled", attr));
}

namespace yuan::emu {
void set_cublaslt_refuses_fused_epilogues(bool refuse) {
  Lock lock(mutex());
  refuse_fused() = refuse;
}
}  // namespace yuan::emu

// One algorithm, valid for exactly this problem and for pointers at least as aligned as the preference promised.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
  Lock lock(mutex());
  *returned = 0;
  if (!handle || !desc || !a || !b || !c || !d || !pref || requested < 1)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: a null argument or no result asked");
  const Problem p = shape(*desc, *a, *b, *c, *d);
  if (!p.error.empty()) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: " + p.error);
  for (uint32_t al : pref->align)
    if (al == 0 || (al & (al - 1)) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, format("a minimum alignment of %u bytes", al));
  // A valid problem without an algorithm: what a GPU's library answers for an epilogue it has no kernel for.
  if (refuse_fused() && fused(desc->epilogue)) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memset(&results[0], 0, sizeof results[0]);
  const cublasLtMatrixLayoutOpaque_t* const layouts[4] = {a, b, c, d};
  uint64_t* algo = results[0].algo.data;
  algo[0] = kAlgoMagic;
  algo[1] = fingerprint(*desc, layouts);
  for (int i = 0; i < 4; i++) algo[2 + i] = pref->align[i];
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  Calling calling("cublasLtMatmul", __builtin_return_address(0));  // names the GEMM in race reports
  Lock lock(mutex());
  if (!handle || !desc || !alpha || !beta || !a || !b || !c || !d || !algo)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a null argument");
  if (sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!valid_stream(stream)) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: not a live stream");
  Gemm g{*desc, *a, *b, *c, *d, shape(*desc, *a, *b, *c, *d), *static_cast<const float*>(alpha),
         *static_cast<const float*>(beta), A, B, C, D};
  if (!g.p.error.empty()) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: " + g.p.error);
  const cublasLtMatrixLayoutOpaque_t* const layouts[4] = {a, b, c, d};
  if (algo->data[0] != kAlgoMagic || algo->data[1] != fingerprint(*desc, layouts))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                "cublasLtMatmul: the algorithm was not chosen by the heuristic for this problem (shape, types, "
                "transposes, epilogue or leading dimensions differ)");
  const void* ptrs[4] = {A, B, C, D};
  const char* names = "ABCD";
  for (int i = 0; i < 4; i++)
    if (alignment_of(ptrs[i]) < algo->data[2 + i])
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  format("cublasLtMatmul: %c at %p is %u-byte aligned; the algorithm was chosen for %llu-byte "
                         "alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                         names[i], ptrs[i], alignment_of(ptrs[i]), (unsigned long long)algo->data[2 + i], names[i]));
  const uint32_t e = desc->epilogue;
  const size_t es = type_size(d->type);
  const bool in_place = C == D;
  if (in_place && (c->ld != d->ld || c->type != d->type || c->batch_stride != d->batch_stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: C and D are the same memory with different layouts");
  // Extents now, as the library checks its arguments; initialisation when the GEMM runs (Gemm::uninitialised).
  std::string bad = check_matrix("A", A, a->type, a->rows, a->cols, a->ld, a->batch, a->batch_stride, false);
  if (bad.empty()) bad = check_matrix("B", B, b->type, b->rows, b->cols, b->ld, b->batch, b->batch_stride, false);
  if (bad.empty() && g.beta != 0.0f)
    bad = check_matrix("C", C, c->type, c->rows, c->cols, c->ld, c->batch, c->batch_stride, false);
  if (bad.empty()) bad = check_matrix("D", D, d->type, d->rows, d->cols, d->ld, d->batch, d->batch_stride, false);
  if (bad.empty() && (reads_bias(e) || writes_bias(e))) {
    const uint64_t len = e == CUBLASLT_EPILOGUE_BGRADB ? g.p.n : g.p.m;
    bad = desc->bias ? check_matrix("bias", desc->bias, d->type, len, 1, len, d->batch, desc->bias_batch_stride, false)
                     : "the epilogue needs CUBLASLT_MATMUL_DESC_BIAS_POINTER";
  }
  if (bad.empty() && (reads_aux(e) || writes_aux(e)))
    bad = desc->aux ? check_matrix("aux", desc->aux, d->type, g.p.m, g.p.n, desc->aux_ld, d->batch,
                                   desc->aux_batch_stride, false)
                    : "the epilogue needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER";
  if (bad.empty() && workspace_bytes) bad = check_range(Space::Device, workspace, workspace_bytes, false);
  if (!bad.empty()) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: " + bad);
  // The output must not be an input: a GPU would read values the GEMM already overwrote.
  const size_t dspan = span_elems(d->rows, d->cols, d->ld) * es;
  if (overlaps(D, dspan, A, span_elems(a->rows, a->cols, a->ld) * type_size(a->type)) ||
      overlaps(D, dspan, B, span_elems(b->rows, b->cols, b->ld) * type_size(b->type)))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: D overlaps A or B");
  enqueue(stream, [g](bool) {
    g.run();
    return true;
  });
  return CUBLAS_STATUS_SUCCESS;
}
