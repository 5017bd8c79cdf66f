// cuDNN 9's backend API in the emulator: what NVIDIA's cuDNN frontend (header-only) calls, against cuDNN's own
// headers, so that the frontend's graphs run here unchanged.
//
// Descriptors keep every attribute as set (type, element count, raw values). Finalize validates per descriptor type
// as cuDNN does and makes of the attributes a value that no later change or destruction of another descriptor
// affects: a tensor, an operation (matmul, pointwise, reduction, reshape), an operation graph (its operations in
// topological order), an engine configuration, an execution plan. There is one engine (global index 0, no knobs):
// the heuristics return it for every graph, and finalizing an execution plan is where a graph the engine does not
// run is refused (the fused-attention rules below; operations or modes the emulator does not model).
//
// cudnnBackendExecute checks the variant pack against the plan's graph (every non-virtual tensor's uid, device
// pointers inside live allocations and aligned as the tensors promise, the workspace as large as the plan reported)
// and enqueues the graph on the handle's stream, where it is interpreted operation by operation: each tensor is a
// dims/strides view; non-virtual tensors are read from and written to device memory (reads checked for
// initialisation when the graph runs, as a kernel's would be), virtual ones are fp32 arrays; by-value scalars come
// from the variant pack (a host pointer, read when cudnnBackendExecute is called). Every operation computes in fp32
// and each result is rounded to its tensor's data type when stored (bf16 and fp16 round to nearest even, as the
// GPU's conversions):
//   matmul     C[.., m, n] = sum over k in k order of A[.., m, k] B[.., k, n], leading dims broadcast (size 1)
//   pointwise  y = op(x, b[, t]) elementwise, inputs broadcast along dims of size 1; GEN_INDEX is the index along
//              POINTWISE_AXIS; comparisons give 1 or 0; BINARY_SELECT is t ? x : b
//   reduction  y reduces x over the dims where y has size 1 and x does not, in index order
//   reshape    y is x's memory seen through y's dims and strides, with y's data type (the frontend's transposes:
//              K^T of a non-virtual K, P^T and dS^T of virtual ones)
// The fused-attention pattern (a graph whose first matmul multiplies two non-virtual tensors Q [b, h, s_q, d] and K,
// or K^T through a reshape: the frontend's SDPA forward and backward) is held to what cuDNN's fused-attention engines
// accept: head size d a multiple of 8 and at most 256; io tensors bf16 or fp16 (fp32 only for the softmax statistics
// and an accumulator the graph writes and reads again); each io tensor contiguous along its head dim (stride 1: the
// last dim, or the one before it in K^T) and its other strides multiples of 16 bytes. Its workspace: none forward;
// backward (the graph reads the softmax statistics), an fp32 dQ accumulator and a row of softmax sums,
// b h s_q d 4 + b h s_q 4 bytes, which the engine is given and the emulator checks, not uses. Not modelled: the
// engine's speed, several engines or knobs, CUDA graphs, the legacy API.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "emulator.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace yuan::emu {
namespace {

thread_local std::string t_last_error;

cudnnStatus_t fail(cudnnStatus_t s, const std::string& why) {
  t_last_error = "cuDNN (emulated): " + why;
  return s;
}

// At execution, a program error as cuBLASLt's refusals are: reported (a Library check) and returned.
cudnnStatus_t refuse_execute(cudnnStatus_t s, const std::string& why) {
  report(Check::Library, Where{}, 0, "cudnnBackendExecute: " + why, false, cudaErrorInvalidValue);
  return fail(s, "cudnnBackendExecute: " + why);
}

// ---- attributes ----

size_t attribute_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void*);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_INT32: return sizeof(int32_t);
    case CUDNN_TYPE_FRACTION: return sizeof(cudnnFraction_t);
    default: return sizeof(int32_t);  // every other attribute type is one of cuDNN's enums
  }
}

struct Attribute {
  cudnnBackendAttributeType_t type;
  int64_t count = 0;
  std::vector<char> bytes;
};

// ---- what Finalize makes of the attributes ----

struct Tensor {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t alignment = 0;
  bool is_virtual = false, by_value = false;

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  int rank() const { return static_cast<int>(dims.size()); }
  // The offset, in elements, of the last element its strides reach.
  int64_t last_offset() const {
    int64_t last = 0;
    for (int i = 0; i < rank(); i++) last += (dims[i] - 1) * strides[i];
    return last;
  }
};
using TensorP = std::shared_ptr<const Tensor>;

enum class OpKind { Matmul, Pointwise, Reduction, Reshape };

struct Op {
  explicit Op(OpKind k) : kind(k) {}
  OpKind kind;
  int mode = 0;  // cudnnPointwiseMode_t or cudnnReduceTensorOp_t
  int64_t axis = -1;  // GEN_INDEX
  float alpha1 = 1, alpha2 = 1;
  double relu_lower = 0;
  std::vector<TensorP> in;  // matmul A, B; pointwise X[, B[, T]]; reduction and reshape X
  TensorP out;
};
using OpP = std::shared_ptr<const Op>;

// The fused-attention pattern's sizes, when a graph has it.
struct Attention {
  bool present = false, backward = false;
  int64_t b = 0, h = 0, s_q = 0, d = 0;
};

struct Graph {
  std::vector<OpP> ops;  // topological order
  std::map<int64_t, TensorP> tensors;
  Attention attention;
  int64_t workspace = 0;

  const Op* producer(int64_t uid) const {
    for (const OpP& op : ops)
      if (op->out->uid == uid) return op.get();
    return nullptr;
  }
};
using GraphP = std::shared_ptr<const Graph>;

struct Desc {
  explicit Desc(cudnnBackendDescriptorType_t t) : type(t) {}
  cudnnBackendDescriptorType_t type;
  std::map<int, Attribute> attributes;
  bool finalized = false;
  TensorP tensor;
  OpP op;
  GraphP graph;             // operation graph, heuristics, engine, engine configuration, execution plan
  cudnnHandle_t handle = nullptr;
  // variant pack
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  void* workspace = nullptr;
};

Desc* as_desc(cudnnBackendDescriptor_t d) { return static_cast<Desc*>(d); }

const Attribute* find(const Desc& d, cudnnBackendAttributeName_t name) {
  const auto it = d.attributes.find(name);
  return it == d.attributes.end() ? nullptr : &it->second;
}

template <typename T>
std::vector<T> values(const Attribute& a) {
  std::vector<T> v(a.count);
  if (a.count) std::memcpy(v.data(), a.bytes.data(), a.count * sizeof(T));
  return v;
}

// One value of an attribute, or `fallback` when it was not set; false when it was set with another type or count.
template <typename T>
bool scalar(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, T* out) {
  const Attribute* a = find(d, name);
  if (!a) return true;
  if (a->type != type || a->count != 1) return false;
  std::memcpy(out, a->bytes.data(), sizeof(T));
  return true;
}

// A descriptor attribute: the finalized descriptors it names (status BAD_PARAM_NOT_FINALIZED otherwise).
cudnnStatus_t descriptors(const Desc& d, cudnnBackendAttributeName_t name, const char* what,
                          std::vector<Desc*>* out, bool required = true) {
  const Attribute* a = find(d, name);
  out->clear();
  if (!a) return required ? fail(CUDNN_STATUS_BAD_PARAM, format("%s is not set", what)) : CUDNN_STATUS_SUCCESS;
  if (a->type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, what);
  for (cudnnBackendDescriptor_t p : values<cudnnBackendDescriptor_t>(*a)) {
    if (!p) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, format("%s holds a null descriptor", what));
    if (!as_desc(p)->finalized) return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, format("%s is not finalized", what));
    out->push_back(as_desc(p));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t one_tensor(const Desc& d, cudnnBackendAttributeName_t name, const char* what, TensorP* out,
                         bool required = true) {
  std::vector<Desc*> v;
  if (cudnnStatus_t s = descriptors(d, name, what, &v, required)) return s;
  if (v.empty()) return CUDNN_STATUS_SUCCESS;
  if (v.size() != 1 || v[0]->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, format("%s must be one tensor descriptor", what));
  *out = v[0]->tensor;
  return CUDNN_STATUS_SUCCESS;
}

size_t type_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT64: case CUDNN_DATA_DOUBLE: return 8;
    case CUDNN_DATA_BOOLEAN: case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: return 1;
    default: return 0;
  }
}
bool modelled_type(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16 || t == CUDNN_DATA_INT32 ||
         t == CUDNN_DATA_INT64 || t == CUDNN_DATA_BOOLEAN;
}
std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// ---- Finalize, per descriptor type ----

cudnnStatus_t finalize_tensor(Desc& d) {
  Tensor t;
  const Attribute *type = find(d, CUDNN_ATTR_TENSOR_DATA_TYPE), *dims = find(d, CUDNN_ATTR_TENSOR_DIMENSIONS),
                  *strides = find(d, CUDNN_ATTR_TENSOR_STRIDES), *uid = find(d, CUDNN_ATTR_TENSOR_UNIQUE_ID),
                  *align = find(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
  if (!type || !dims || !strides || !uid || !align)
    return fail(CUDNN_STATUS_BAD_PARAM,
                "a tensor needs DATA_TYPE, DIMENSIONS, STRIDES, UNIQUE_ID and BYTE_ALIGNMENT");
  if (type->type != CUDNN_TYPE_DATA_TYPE || dims->type != CUDNN_TYPE_INT64 || strides->type != CUDNN_TYPE_INT64 ||
      uid->type != CUDNN_TYPE_INT64 || align->type != CUDNN_TYPE_INT64)
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "a tensor attribute of the wrong type");
  t.type = values<cudnnDataType_t>(*type)[0];
  t.dims = values<int64_t>(*dims);
  t.strides = values<int64_t>(*strides);
  t.uid = values<int64_t>(*uid)[0];
  t.alignment = values<int64_t>(*align)[0];
  if (!scalar(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &t.is_virtual) ||
      !scalar(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &t.by_value))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "IS_VIRTUAL / IS_BY_VALUE must be one boolean");
  if (t.dims.empty() || t.dims.size() > CUDNN_DIM_MAX || t.dims.size() != t.strides.size())
    return fail(CUDNN_STATUS_BAD_PARAM, format("tensor %lld: %zu dims and %zu strides", (long long)t.uid,
                                               t.dims.size(), t.strides.size()));
  for (size_t i = 0; i < t.dims.size(); i++)
    if (t.dims[i] <= 0 || t.strides[i] <= 0)
      return fail(CUDNN_STATUS_BAD_PARAM, format("tensor %lld: dims %s, strides %s (each must be positive)",
                                                 (long long)t.uid, dims_text(t.dims).c_str(),
                                                 dims_text(t.strides).c_str()));
  if (t.alignment <= 0 || (t.alignment & (t.alignment - 1)))
    return fail(CUDNN_STATUS_BAD_PARAM, format("tensor %lld: byte alignment %lld is not a power of two",
                                               (long long)t.uid, (long long)t.alignment));
  if (t.is_virtual && t.by_value)
    return fail(CUDNN_STATUS_BAD_PARAM, format("tensor %lld is both virtual and by value", (long long)t.uid));
  if (find(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC))
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "ragged tensors are not modelled");
  d.tensor = std::make_shared<const Tensor>(t);
  return CUDNN_STATUS_SUCCESS;
}

// Same rank, and each input dim equal to the output's or 1.
bool broadcasts(const Tensor& in, const Tensor& out) {
  if (in.rank() != out.rank()) return false;
  for (int i = 0; i < in.rank(); i++)
    if (in.dims[i] != out.dims[i] && in.dims[i] != 1) return false;
  return true;
}

bool binary(int mode) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_ADD_SQUARE: case CUDNN_POINTWISE_DIV: case CUDNN_POINTWISE_MAX:
    case CUDNN_POINTWISE_MIN: case CUDNN_POINTWISE_MOD: case CUDNN_POINTWISE_MUL: case CUDNN_POINTWISE_POW:
    case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ: case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
    case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR: case CUDNN_POINTWISE_BINARY_SELECT:
      return true;
  }
  return false;
}
bool modelled_pointwise(int mode) {
  if (binary(mode)) return true;
  switch (mode) {
    case CUDNN_POINTWISE_ABS: case CUDNN_POINTWISE_CEIL: case CUDNN_POINTWISE_COS: case CUDNN_POINTWISE_EXP:
    case CUDNN_POINTWISE_FLOOR: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_NEG: case CUDNN_POINTWISE_RSQRT:
    case CUDNN_POINTWISE_SIN: case CUDNN_POINTWISE_SQRT: case CUDNN_POINTWISE_TAN: case CUDNN_POINTWISE_ERF:
    case CUDNN_POINTWISE_IDENTITY: case CUDNN_POINTWISE_RECIPROCAL: case CUDNN_POINTWISE_RELU_FWD:
    case CUDNN_POINTWISE_TANH_FWD: case CUDNN_POINTWISE_SIGMOID_FWD: case CUDNN_POINTWISE_LOGICAL_NOT:
    case CUDNN_POINTWISE_GEN_INDEX:
      return true;
  }
  return false;
}
bool modelled_reduction(int mode) {
  return mode == CUDNN_REDUCE_TENSOR_ADD || mode == CUDNN_REDUCE_TENSOR_MUL || mode == CUDNN_REDUCE_TENSOR_MIN ||
         mode == CUDNN_REDUCE_TENSOR_MAX || mode == CUDNN_REDUCE_TENSOR_AMAX || mode == CUDNN_REDUCE_TENSOR_AVG;
}

// A sub-descriptor (pointwise, matmul, reduction) of an operation: finalized, of its type.
cudnnStatus_t sub_descriptor(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendDescriptorType_t type,
                             const char* what, const Desc** out) {
  std::vector<Desc*> v;
  if (cudnnStatus_t s = descriptors(d, name, what, &v)) return s;
  if (v.size() != 1 || v[0]->type != type)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, format("%s has the wrong descriptor type", what));
  *out = v[0];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_pointwise_op(Desc& d) {
  Op op(OpKind::Pointwise);
  const Desc* pw;
  if (cudnnStatus_t s = sub_descriptor(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                       CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "POINTWISE_PW_DESCRIPTOR", &pw))
    return s;
  cudnnPointwiseMode_t mode{};
  if (!find(*pw, CUDNN_ATTR_POINTWISE_MODE) ||
      !scalar(*pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode))
    return fail(CUDNN_STATUS_BAD_PARAM, "the pointwise descriptor has no MODE");
  op.mode = mode;
  if (!scalar(*pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &op.axis) ||
      !scalar(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, &op.relu_lower) ||
      !scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, &op.alpha1) ||
      !scalar(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, &op.alpha2))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "a pointwise attribute of the wrong type");
  TensorP x, b, t, y;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "POINTWISE_XDESC", &x)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "POINTWISE_YDESC", &y)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "POINTWISE_BDESC", &b, binary(mode)))
    return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, "POINTWISE_TDESC", &t,
                                   mode == CUDNN_POINTWISE_BINARY_SELECT))
    return s;
  op.in = {x};
  if (b) op.in.push_back(b);
  if (t) op.in.push_back(t);
  for (const TensorP& in : op.in)
    if (!broadcasts(*in, *y))
      return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                  format("pointwise: input %lld %s does not broadcast to output %lld %s", (long long)in->uid,
                         dims_text(in->dims).c_str(), (long long)y->uid, dims_text(y->dims).c_str()));
  if (mode == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= y->rank()))
    return fail(CUDNN_STATUS_BAD_PARAM, format("GEN_INDEX: axis %lld of a rank-%d tensor", (long long)op.axis,
                                               y->rank()));
  op.out = y;
  d.op = std::make_shared<const Op>(op);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_matmul_op(Desc& d) {
  Op op(OpKind::Matmul);
  const Desc* mm;
  if (cudnnStatus_t s = sub_descriptor(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR,
                                       "MATMUL_DESC", &mm))
    return s;
  TensorP a, b, c;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, "MATMUL_ADESC", &a)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, "MATMUL_BDESC", &b)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, "MATMUL_CDESC", &c)) return s;
  const int r = c->rank();
  if (r < 2 || a->rank() != r || b->rank() != r)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "matmul: A, B and C must have one rank, at least 2");
  bool ok = a->dims[r - 2] == c->dims[r - 2] && b->dims[r - 1] == c->dims[r - 1] && a->dims[r - 1] == b->dims[r - 2];
  for (int i = 0; i < r - 2; i++)
    ok = ok && (a->dims[i] == c->dims[i] || a->dims[i] == 1) && (b->dims[i] == c->dims[i] || b->dims[i] == 1);
  if (!ok)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                format("matmul: A %s times B %s does not make C %s", dims_text(a->dims).c_str(),
                       dims_text(b->dims).c_str(), dims_text(c->dims).c_str()));
  if (find(d, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC) ||
      find(d, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC) ||
      find(d, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC))
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "matmul: M/N/K overrides (padded sequences) are not modelled");
  op.in = {a, b};
  op.out = c;
  d.op = std::make_shared<const Op>(op);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_reduction_op(Desc& d) {
  Op op(OpKind::Reduction);
  const Desc* red;
  if (cudnnStatus_t s = sub_descriptor(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
                                       "REDUCTION_DESC", &red))
    return s;
  cudnnReduceTensorOp_t mode{};
  if (!find(*red, CUDNN_ATTR_REDUCTION_OPERATOR) ||
      !scalar(*red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode))
    return fail(CUDNN_STATUS_BAD_PARAM, "the reduction descriptor has no OPERATOR");
  op.mode = mode;
  TensorP x, y;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, "REDUCTION_XDESC", &x)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, "REDUCTION_YDESC", &y)) return s;
  if (!broadcasts(*y, *x))
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                format("reduction: output %s is not input %s with dims reduced to 1", dims_text(y->dims).c_str(),
                       dims_text(x->dims).c_str()));
  op.in = {x};
  op.out = y;
  d.op = std::make_shared<const Op>(op);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_reshape_op(Desc& d) {
  Op op(OpKind::Reshape);
  TensorP x, y;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, "RESHAPE_XDESC", &x)) return s;
  if (cudnnStatus_t s = one_tensor(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, "RESHAPE_YDESC", &y)) return s;
  if (x->elements() != y->elements())
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                format("reshape: %s to %s changes the element count", dims_text(x->dims).c_str(),
                       dims_text(y->dims).c_str()));
  op.in = {x};
  op.out = y;
  d.op = std::make_shared<const Op>(op);
  return CUDNN_STATUS_SUCCESS;
}

// The fused-attention pattern: the first matmul (in topological order) of two non-virtual tensors, or of a
// non-virtual tensor and a reshape of one (the frontend's K^T view), with A = Q [b, h, s_q, d].
Attention find_attention(const Graph& g) {
  Attention at;
  auto stored = [&](const TensorP& t) {
    if (!t->is_virtual) return true;
    const Op* p = g.producer(t->uid);
    return p && p->kind == OpKind::Reshape && !p->in[0]->is_virtual;
  };
  for (const OpP& op : g.ops) {
    if (op->kind != OpKind::Matmul || op->in[0]->rank() != 4 || !stored(op->in[0]) || !stored(op->in[1])) continue;
    at.present = true;
    at.b = op->in[0]->dims[0], at.h = op->in[0]->dims[1], at.s_q = op->in[0]->dims[2], at.d = op->in[0]->dims[3];
    break;
  }
  if (!at.present) return at;
  // The backward reads the softmax statistics: an fp32 [b, h, s_q, 1] tensor nothing in the graph produces.
  for (const auto& [uid, t] : g.tensors)
    if (!t->is_virtual && !g.producer(uid) && t->type == CUDNN_DATA_FLOAT && t->rank() == 4 &&
        t->dims == std::vector<int64_t>{at.b, at.h, at.s_q, 1})
      at.backward = true;
  return at;
}

cudnnStatus_t finalize_graph(Desc& d) {
  std::vector<Desc*> ops;
  if (cudnnStatus_t s = descriptors(d, CUDNN_ATTR_OPERATIONGRAPH_OPS, "OPERATIONGRAPH_OPS", &ops)) return s;
  if (!scalar(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &d.handle) || !d.handle)
    return fail(CUDNN_STATUS_BAD_PARAM, "OPERATIONGRAPH_HANDLE is not set");
  if (ops.empty()) return fail(CUDNN_STATUS_BAD_PARAM, "an operation graph without operations");
  auto g = std::make_shared<Graph>();
  std::vector<OpP> pending;
  std::map<int64_t, int> writers;
  for (Desc* o : ops) {
    if (!o->op) return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "OPERATIONGRAPH_OPS holds a non-operation");
    pending.push_back(o->op);
    writers[o->op->out->uid]++;
    std::vector<TensorP> all = o->op->in;
    all.push_back(o->op->out);
    for (const TensorP& t : all) {
      TensorP& known = g->tensors[t->uid];
      if (known && (known->dims != t->dims || known->strides != t->strides || known->type != t->type ||
                    known->is_virtual != t->is_virtual || known->by_value != t->by_value))
        return fail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
                    format("two different tensors have the unique id %lld", (long long)t->uid));
      known = t;
    }
  }
  for (const auto& [uid, n] : writers)
    if (n > 1)
      return fail(CUDNN_STATUS_BAD_PARAM, format("tensor %lld is written by %d operations", (long long)uid, n));
  for (const auto& [uid, t] : g->tensors)
    if (t->is_virtual && !writers.count(uid))
      return fail(CUDNN_STATUS_BAD_PARAM, format("virtual tensor %lld is written by no operation", (long long)uid));
  // Topological order: an operation runs once every tensor it reads that an operation writes is written.
  std::map<int64_t, bool> written;
  while (!pending.empty()) {
    const auto ready = std::find_if(pending.begin(), pending.end(), [&](const OpP& op) {
      return std::all_of(op->in.begin(), op->in.end(),
                         [&](const TensorP& t) { return !writers.count(t->uid) || written[t->uid]; });
    });
    if (ready == pending.end()) return fail(CUDNN_STATUS_BAD_PARAM, "the operation graph has a cycle");
    written[(*ready)->out->uid] = true;
    g->ops.push_back(*ready);
    pending.erase(ready);
  }
  g->attention = find_attention(*g);
  const Attention& at = g->attention;
  if (at.backward) g->workspace = at.b * at.h * at.s_q * at.d * 4 + at.b * at.h * at.s_q * 4;
  d.graph = g;
  return CUDNN_STATUS_SUCCESS;
}

// What the one engine runs: the operations and types the interpreter models, and the fused-attention rules.
cudnnStatus_t check_support(const Graph& g) {
  for (const auto& [uid, t] : g.tensors)
    if (!modelled_type(t->type))
      return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                  format("tensor %lld: data type %d is not modelled", (long long)uid, t->type));
  for (const OpP& op : g.ops) {
    if (op->kind == OpKind::Pointwise && !modelled_pointwise(op->mode))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, format("pointwise mode %d is not modelled", op->mode));
    if (op->kind == OpKind::Reduction && !modelled_reduction(op->mode))
      return fail(CUDNN_STATUS_NOT_SUPPORTED, format("reduction operator %d is not modelled", op->mode));
    // A reshape is a view of x's memory through y's dims and strides: within x's extent, and for a virtual x (an
    // array here) over exactly its elements, as a transpose is.
    if (op->kind == OpKind::Reshape) {
      const Tensor &x = *op->in[0], &y = *op->out;
      if (x.is_virtual ? x.last_offset() + 1 != x.elements() || y.last_offset() != x.last_offset()
                       : y.last_offset() > x.last_offset())
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    format("reshape of %s strides %s to %s strides %s: not a view of the same elements",
                           dims_text(x.dims).c_str(), dims_text(x.strides).c_str(), dims_text(y.dims).c_str(),
                           dims_text(y.strides).c_str()));
    }
  }
  const Attention& at = g.attention;
  if (!at.present) return CUDNN_STATUS_SUCCESS;
  if (at.d % 8 != 0 || at.d > 256)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
                format("fused attention: head size %lld (it must be a multiple of 8, at most 256)", (long long)at.d));
  std::map<int64_t, bool> read;
  for (const OpP& op : g.ops)
    for (const TensorP& t : op->in) read[t->uid] = true;
  for (const auto& [uid, t] : g.tensors) {
    if (t->is_virtual || t->by_value || t->dims.back() == 1) continue;  // scalars and row statistics are fp32
    // An fp32 tensor the graph writes and reads again is an accumulator (the backward's dQ, in the workspace).
    const bool accumulator = t->type == CUDNN_DATA_FLOAT && read[uid] && g.producer(uid);
    if (accumulator) continue;
    if (t->type != CUDNN_DATA_BFLOAT16 && t->type != CUDNN_DATA_HALF)
      return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                  format("fused attention: io tensor %lld is not bf16 or fp16", (long long)uid));
    // Contiguous along the head dim (stride 1: the last dim, or the one before it in the frontend's K^T view),
    // every other dim 16 bytes apart or a multiple of that.
    const size_t es = type_size(t->type);
    int unit = -1;
    for (int i = t->rank() - 1; i >= 0 && unit < 0; i--)
      if (t->strides[i] == 1 && t->dims[i] == at.d) unit = i;
    if (unit < 0)
      return fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
                  format("fused attention: io tensor %lld (dims %s, strides %s) is not contiguous along the head dim",
                         (long long)uid, dims_text(t->dims).c_str(), dims_text(t->strides).c_str()));
    for (int i = 0; i < t->rank(); i++)
      if (i != unit && t->dims[i] > 1 && (t->strides[i] * es) % 16 != 0)
        return fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT,
                    format("fused attention: io tensor %lld: stride %lld of dim %d is not a multiple of 16 bytes",
                           (long long)uid, (long long)t->strides[i], i));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine(Desc& d) {
  std::vector<Desc*> g;
  if (cudnnStatus_t s = descriptors(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, "ENGINE_OPERATION_GRAPH", &g)) return s;
  int64_t index = 0;
  if (!scalar(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &index))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "ENGINE_GLOBAL_INDEX");
  if (g.size() != 1 || !g[0]->graph) return fail(CUDNN_STATUS_BAD_PARAM, "ENGINE_OPERATION_GRAPH");
  if (index != 0) return fail(CUDNN_STATUS_NOT_SUPPORTED, format("engine %lld: the emulator has engine 0 only",
                                                                 (long long)index));
  d.graph = g[0]->graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine_config(Desc& d) {
  std::vector<Desc*> e, knobs;
  if (cudnnStatus_t s = descriptors(d, CUDNN_ATTR_ENGINECFG_ENGINE, "ENGINECFG_ENGINE", &e)) return s;
  if (e.size() != 1 || e[0]->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM, "ENGINECFG_ENGINE");
  if (cudnnStatus_t s = descriptors(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, "ENGINECFG_KNOB_CHOICES", &knobs, false))
    return s;
  if (!knobs.empty()) return fail(CUDNN_STATUS_NOT_SUPPORTED, "engine 0 has no knobs");
  d.graph = e[0]->graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_plan(Desc& d) {
  std::vector<Desc*> cfg;
  if (cudnnStatus_t s = descriptors(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, "EXECUTION_PLAN_ENGINE_CONFIG", &cfg))
    return s;
  // The handle is optional since cuDNN 9 (the execution names one).
  if (!scalar(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &d.handle))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "EXECUTION_PLAN_HANDLE");
  if (cfg.size() != 1 || cfg[0]->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || !cfg[0]->graph)
    return fail(CUDNN_STATUS_BAD_PARAM, "EXECUTION_PLAN_ENGINE_CONFIG");
  if (cudnnStatus_t s = check_support(*cfg[0]->graph)) return s;
  d.graph = cfg[0]->graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_variant_pack(Desc& d) {
  const Attribute *uids = find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
                  *ptrs = find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  if (!uids || !ptrs || uids->type != CUDNN_TYPE_INT64 || ptrs->type != CUDNN_TYPE_VOID_PTR)
    return fail(CUDNN_STATUS_BAD_PARAM, "a variant pack needs UNIQUE_IDS and DATA_POINTERS");
  if (uids->count != ptrs->count)
    return fail(CUDNN_STATUS_BAD_PARAM, format("variant pack: %lld unique ids, %lld pointers", (long long)uids->count,
                                               (long long)ptrs->count));
  if (find(d, CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS))
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "variant pack shape overrides are not modelled");
  d.uids = values<int64_t>(*uids);
  d.pointers = values<void*>(*ptrs);
  if (!scalar(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &d.workspace))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "VARIANT_PACK_WORKSPACE");
  return CUDNN_STATUS_SUCCESS;
}

// Sub-descriptors are values of their attributes; these need nothing beyond what cuDNN requires of them.
cudnnStatus_t finalize_plain(Desc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      if (!find(d, CUDNN_ATTR_POINTWISE_MODE)) return fail(CUDNN_STATUS_BAD_PARAM, "POINTWISE_MODE is not set");
      break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      if (!find(d, CUDNN_ATTR_MATMUL_COMP_TYPE)) return fail(CUDNN_STATUS_BAD_PARAM, "MATMUL_COMP_TYPE is not set");
      break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      if (!find(d, CUDNN_ATTR_REDUCTION_OPERATOR)) return fail(CUDNN_STATUS_BAD_PARAM, "REDUCTION_OPERATOR is not set");
      break;
    default: break;
  }
  return CUDNN_STATUS_SUCCESS;
}

// ---- execution ----

float load(const char* p, cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: { float v; std::memcpy(&v, p, 4); return v; }
    case CUDNN_DATA_BFLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_bits_to_float(h); }
    case CUDNN_DATA_HALF: { uint16_t h; std::memcpy(&h, p, 2); return half_bits_to_float(h); }
    case CUDNN_DATA_INT32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<float>(v); }
    case CUDNN_DATA_INT64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<float>(v); }
    default: return *reinterpret_cast<const uint8_t*>(p) ? 1.0f : 0.0f;  // BOOLEAN
  }
}
void store(char* p, cudnnDataType_t t, float v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: std::memcpy(p, &v, 4); break;
    case CUDNN_DATA_BFLOAT16: { const uint16_t h = float_to_bf16_bits(v); std::memcpy(p, &h, 2); break; }
    case CUDNN_DATA_HALF: { const uint16_t h = float_to_half_bits(v); std::memcpy(p, &h, 2); break; }
    case CUDNN_DATA_INT32: { const int32_t i = static_cast<int32_t>(v); std::memcpy(p, &i, 4); break; }
    case CUDNN_DATA_INT64: { const int64_t i = static_cast<int64_t>(v); std::memcpy(p, &i, 8); break; }
    default: *reinterpret_cast<uint8_t*>(p) = v != 0.0f; break;
  }
}
// A value as its tensor's type holds it.
float round_to(cudnnDataType_t t, float v) {
  char b[8];
  store(b, t, v);
  return load(b, t);
}

// Element offsets of a tensor's elements in row-major order of its dims, through `strides`.
std::vector<int64_t> offsets(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<int64_t> out(n);
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t i = 0; i < n; i++) {
    int64_t o = 0;
    for (size_t k = 0; k < dims.size(); k++) o += idx[k] * strides[k];
    out[i] = o;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0 && ++idx[k] == dims[k]; k--) idx[k] = 0;
  }
  return out;
}
// Dense row-major strides of `dims`, 0 along the dims where `in` has size 1 and `out` does not (broadcast).
std::vector<int64_t> broadcast_strides(const Tensor& in, const Tensor& out) {
  std::vector<int64_t> s(in.rank());
  int64_t step = 1;
  for (int k = in.rank() - 1; k >= 0; k--) {
    s[k] = in.dims[k] == out.dims[k] ? step : 0;
    step *= in.dims[k];
  }
  return s;
}

float pointwise(int mode, float x, float b, float t, const Op& op) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_ADD_SQUARE: return x + b * b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_MAX: return std::fmax(x, b);
    case CUDNN_POINTWISE_MIN: return std::fmin(x, b);
    case CUDNN_POINTWISE_MOD: return std::fmod(x, b);
    case CUDNN_POINTWISE_POW: return std::pow(x, b);
    case CUDNN_POINTWISE_CMP_EQ: return x == b;
    case CUDNN_POINTWISE_CMP_NEQ: return x != b;
    case CUDNN_POINTWISE_CMP_GT: return x > b;
    case CUDNN_POINTWISE_CMP_GE: return x >= b;
    case CUDNN_POINTWISE_CMP_LT: return x < b;
    case CUDNN_POINTWISE_CMP_LE: return x <= b;
    case CUDNN_POINTWISE_LOGICAL_AND: return x != 0 && b != 0;
    case CUDNN_POINTWISE_LOGICAL_OR: return x != 0 || b != 0;
    case CUDNN_POINTWISE_LOGICAL_NOT: return x == 0;
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0 ? x : b;
    case CUDNN_POINTWISE_ABS: return std::fabs(x);
    case CUDNN_POINTWISE_CEIL: return std::ceil(x);
    case CUDNN_POINTWISE_FLOOR: return std::floor(x);
    case CUDNN_POINTWISE_COS: return std::cos(x);
    case CUDNN_POINTWISE_SIN: return std::sin(x);
    case CUDNN_POINTWISE_TAN: return std::tan(x);
    case CUDNN_POINTWISE_EXP: return std::exp(x);
    case CUDNN_POINTWISE_LOG: return std::log(x);
    case CUDNN_POINTWISE_NEG: return -x;
    case CUDNN_POINTWISE_RSQRT: return 1.0f / std::sqrt(x);
    case CUDNN_POINTWISE_SQRT: return std::sqrt(x);
    case CUDNN_POINTWISE_ERF: return std::erf(x);
    case CUDNN_POINTWISE_IDENTITY: return x;
    case CUDNN_POINTWISE_RECIPROCAL: return 1.0f / x;
    case CUDNN_POINTWISE_RELU_FWD: return std::fmax(x, static_cast<float>(op.relu_lower));
    case CUDNN_POINTWISE_TANH_FWD: return std::tanh(x);
    case CUDNN_POINTWISE_SIGMOID_FWD: return 1.0f / (1.0f + std::exp(-x));
  }
  return NAN;  // not reached: check_support refused the mode
}

struct Run {
  GraphP graph;
  std::map<int64_t, void*> pointers;  // uid -> device pointer, or host pointer of a by-value scalar

  // Every tensor's value as fp32, dense in row-major order of its dims.
  std::map<int64_t, std::vector<float>> values;

  // A non-virtual tensor read from memory (by-value scalars from the host); empty string when fine.
  std::string read(const Tensor& t) {
    std::vector<float>& v = values[t.uid];
    v.resize(t.elements());
    const char* base = static_cast<const char*>(pointers.at(t.uid));
    const size_t es = type_size(t.type);
    const std::vector<int64_t> off = offsets(t.dims, t.strides);
    for (size_t i = 0; i < off.size(); i++) {
      const char* p = base + off[i] * es;
      if (!t.by_value) {
        const std::string bad = check_range(Space::Device, p, es, true);
        if (!bad.empty()) return format("tensor %lld: %s", (long long)t.uid, bad.c_str());
        note_access(p, es, false);
      }
      v[i] = load(p, t.type);
    }
    return {};
  }

  void write(const Tensor& t) {
    char* base = static_cast<char*>(pointers.at(t.uid));
    const size_t es = type_size(t.type);
    const std::vector<int64_t> off = offsets(t.dims, t.strides);
    const std::vector<float>& v = values[t.uid];
    for (size_t i = 0; i < off.size(); i++) {
      store(base + off[i] * es, t.type, v[i]);
      mark_initialised(base + off[i] * es, es);
      note_access(base + off[i] * es, es, true);
    }
  }

  std::string input(const TensorP& t) {
    if (values.count(t->uid)) return {};
    return read(*t);
  }

  std::string run_op(const Op& op) {
    for (const TensorP& t : op.in)
      if (std::string bad = input(t); !bad.empty()) return bad;
    const Tensor& y = *op.out;
    std::vector<float> out(y.elements());
    if (op.kind == OpKind::Pointwise) {
      std::vector<std::vector<int64_t>> in_off;
      for (const TensorP& t : op.in) in_off.push_back(offsets(y.dims, broadcast_strides(*t, y)));
      int64_t axis_step = 1;
      for (int k = y.rank() - 1; k > op.axis && op.axis >= 0; k--) axis_step *= y.dims[k];
      for (size_t i = 0; i < out.size(); i++) {
        if (op.mode == CUDNN_POINTWISE_GEN_INDEX) {
          out[i] = static_cast<float>(static_cast<int64_t>(i) / axis_step % y.dims[op.axis]);
          continue;
        }
        const float x = op.alpha1 * values[op.in[0]->uid][in_off[0][i]];
        const float b = op.in.size() > 1 ? op.alpha2 * values[op.in[1]->uid][in_off[1][i]] : 0.0f;
        const float t = op.in.size() > 2 ? values[op.in[2]->uid][in_off[2][i]] : 0.0f;
        out[i] = pointwise(op.mode, x, b, t, op);
      }
    } else if (op.kind == OpKind::Reduction) {
      const Tensor& x = *op.in[0];
      const std::vector<int64_t> to_out = offsets(x.dims, broadcast_strides(y, x));
      const std::vector<float>& xv = values[x.uid];
      std::vector<bool> started(out.size(), false);
      std::vector<int64_t> count(out.size(), 0);
      for (size_t i = 0; i < xv.size(); i++) {
        const int64_t o = to_out[i];
        float v = xv[i];
        if (op.mode == CUDNN_REDUCE_TENSOR_AMAX) v = std::fabs(v);
        count[o]++;
        if (!started[o]) {
          out[o] = v;
          started[o] = true;
          continue;
        }
        switch (op.mode) {
          case CUDNN_REDUCE_TENSOR_ADD: case CUDNN_REDUCE_TENSOR_AVG: out[o] += v; break;
          case CUDNN_REDUCE_TENSOR_MUL: out[o] *= v; break;
          case CUDNN_REDUCE_TENSOR_MIN: out[o] = std::fmin(out[o], v); break;
          default: out[o] = std::fmax(out[o], v); break;  // MAX, AMAX
        }
      }
      if (op.mode == CUDNN_REDUCE_TENSOR_AVG)
        for (size_t o = 0; o < out.size(); o++) out[o] /= static_cast<float>(count[o]);
    } else if (op.kind == OpKind::Matmul) {
      const Tensor &a = *op.in[0], &b = *op.in[1];
      const int r = y.rank();
      const int64_t m = y.dims[r - 2], n = y.dims[r - 1], k = a.dims[r - 1];
      // The batch dims of C, and where each batch of A and B starts (broadcast along dims of size 1).
      Tensor cb = y, ab = a, bb = b;
      cb.dims[r - 2] = cb.dims[r - 1] = ab.dims[r - 2] = ab.dims[r - 1] = bb.dims[r - 2] = bb.dims[r - 1] = 1;
      const std::vector<int64_t> a_batch = offsets(cb.dims, broadcast_strides(ab, cb)),
                                 b_batch = offsets(cb.dims, broadcast_strides(bb, cb));
      const std::vector<float>&av = values[a.uid], &bv = values[b.uid];
      for (size_t bi = 0; bi < a_batch.size(); bi++) {
        const float* ap = av.data() + a_batch[bi] * m * k;
        const float* bp = bv.data() + b_batch[bi] * k * n;
        float* cp = out.data() + bi * m * n;
        for (int64_t i = 0; i < m; i++)
          for (int64_t kk = 0; kk < k; kk++) {
            const float x = ap[i * k + kk];
            for (int64_t j = 0; j < n; j++) cp[i * n + j] += x * bp[kk * n + j];
          }
      }
    } else {  // Reshape: y's dims and strides over x's memory (for a virtual x, its array laid out by its strides)
      const Tensor& x = *op.in[0];
      std::vector<float> memory(x.last_offset() + 1);
      const std::vector<int64_t> x_off = offsets(x.dims, x.strides), y_off = offsets(y.dims, y.strides);
      const std::vector<float>& xv = values[x.uid];
      for (size_t i = 0; i < x_off.size(); i++) memory[x_off[i]] = xv[i];
      for (size_t j = 0; j < y_off.size(); j++) out[j] = memory[y_off[j]];
    }
    for (float& v : out) v = round_to(y.type, v);
    values[y.uid] = std::move(out);
    if (!y.is_virtual) write(y);
    return {};
  }

  void operator()() {
    for (const OpP& op : graph->ops) {
      const std::string bad = run_op(*op);
      if (!bad.empty()) {
        report(Check::Uninitialised, Where{"cudnnBackendExecute (emulated)", {}, {}}, 0, "the graph reads " + bad,
               true, cudaErrorLaunchFailure);
        return;
      }
    }
  }
};

// The bytes [p, p + span) a non-virtual tensor covers.
size_t span_bytes(const Tensor& t) { return (t.last_offset() + 1) * type_size(t.type); }

cudnnStatus_t execute(cudnnHandle_t handle, const Desc& plan, const Desc& pack) {
  const Graph& g = *plan.graph;
  Run run{plan.graph, {}, {}};
  for (size_t i = 0; i < pack.uids.size(); i++) run.pointers[pack.uids[i]] = pack.pointers[i];
  for (const auto& [uid, t] : g.tensors) {
    if (t->is_virtual) continue;
    const auto it = run.pointers.find(uid);
    if (it == run.pointers.end())
      return refuse_execute(CUDNN_STATUS_BAD_PARAM, format("the variant pack has no pointer for tensor %lld",
                                                           (long long)uid));
    if (!it->second)
      return refuse_execute(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, format("tensor %lld: null pointer", (long long)uid));
    if (t->by_value) {  // a host pointer to the value, read now as cuDNN does (the caller's variable may go)
      if (std::string bad = run.read(*t); !bad.empty()) return refuse_execute(CUDNN_STATUS_BAD_PARAM, bad);
      continue;
    }
    if (reinterpret_cast<uintptr_t>(it->second) % t->alignment != 0)
      return refuse_execute(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                            format("tensor %lld at %p: not %lld-byte aligned as its BYTE_ALIGNMENT says",
                                   (long long)uid, it->second, (long long)t->alignment));
    const std::string bad = check_range(Space::Device, it->second, span_bytes(*t), false);
    if (!bad.empty())
      return refuse_execute(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, format("tensor %lld %s strides %s: %s", (long long)uid,
                                                                        dims_text(t->dims).c_str(),
                                                                        dims_text(t->strides).c_str(), bad.c_str()));
  }
  if (g.workspace > 0) {
    if (!pack.workspace)
      return refuse_execute(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            format("the plan needs a %lld-byte workspace; the variant pack has none",
                                   (long long)g.workspace));
    // cuDNN cannot know the workspace's size; the emulator knows its allocation's.
    const std::string bad = check_range(Space::Device, pack.workspace, g.workspace, false);
    if (!bad.empty())
      return refuse_execute(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
                            format("the workspace at %p is smaller than the plan's %lld bytes: %s", pack.workspace,
                                   (long long)g.workspace, bad.c_str()));
  }
  enqueue(handle->stream, [run](bool) mutable {
    run();
    return true;
  });
  return CUDNN_STATUS_SUCCESS;
}

// ---- GetAttribute ----

// Copies `n` values of `type` out (the caller's count and buffer as cuDNN takes them).
template <typename T>
cudnnStatus_t answer(const std::vector<T>& v, cudnnBackendAttributeType_t want, cudnnBackendAttributeType_t type,
                     int64_t requested, int64_t* count, void* out) {
  if (want != type) return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "GetAttribute: the wrong attribute type");
  if (count) *count = static_cast<int64_t>(v.size());
  if (out) std::memcpy(out, v.data(), std::min<int64_t>(requested, v.size()) * sizeof(T));
  return CUDNN_STATUS_SUCCESS;
}

// Fills the caller's descriptor `out` (created by the caller, of the type the attribute holds) from `from`.
cudnnStatus_t fill(cudnnBackendDescriptor_t out, cudnnBackendDescriptorType_t type, const Desc& from) {
  if (!out) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "GetAttribute: a null descriptor to fill");
  Desc& d = *as_desc(out);
  if (d.type != type)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "GetAttribute: a descriptor of the wrong type");
  d.graph = from.graph;
  d.handle = from.handle;
  d.finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

std::string plan_json(const Desc& d) {
  const Graph& g = *d.graph;
  std::string ops;
  for (const OpP& op : g.ops) ops += std::string(ops.empty() ? "" : ",") + "\"" +
                                     (op->kind == OpKind::Matmul      ? "matmul"
                                      : op->kind == OpKind::Pointwise ? "pointwise"
                                      : op->kind == OpKind::Reduction ? "reduction"
                                                                      : "reshape") +
                                     "\"";
  return format("{\"engine\":0,\"emulated\":true,\"workspace\":%lld,\"operations\":[%s]}", (long long)g.workspace,
                ops.c_str());
}

cudnnStatus_t get_attribute(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t requested, int64_t* count, void* out) {
  auto descriptor_out = [&](cudnnBackendDescriptorType_t t) -> cudnnStatus_t {
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "GetAttribute");
    if (count) *count = 1;
    if (!out || requested < 1) return CUDNN_STATUS_SUCCESS;
    return fill(*static_cast<cudnnBackendDescriptor_t*>(out), t, d);
  };
  switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: return descriptor_out(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);  // engine 0
    case CUDNN_ATTR_ENGINECFG_ENGINE: return descriptor_out(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: return descriptor_out(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH: return descriptor_out(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: case CUDNN_ATTR_ENGINE_KNOB_INFO:
      return answer(std::vector<cudnnBackendDescriptor_t>{}, CUDNN_TYPE_BACKEND_DESCRIPTOR, type, requested, count,
                    out);
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      return answer(std::vector<int64_t>{0}, CUDNN_TYPE_INT64, type, requested, count, out);
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
      return answer(std::vector<int64_t>{1}, CUDNN_TYPE_INT64, type, requested, count, out);
    // The interpreter sums in a fixed order: deterministic, not NONDETERMINISTIC; bf16 inputs on tensor cores.
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
      return answer(std::vector<cudnnBackendNumericalNote_t>{CUDNN_NUMERICAL_NOTE_TENSOR_CORE},
                    CUDNN_TYPE_NUMERICAL_NOTE, type, requested, count, out);
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE:
      return answer(std::vector<cudnnBackendBehaviorNote_t>{}, CUDNN_TYPE_BEHAVIOR_NOTE, type, requested, count, out);
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
      return answer(std::vector<int64_t>{d.graph ? d.graph->workspace : 0}, CUDNN_TYPE_INT64, type, requested, count,
                    out);
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED:
      return answer(std::vector<int32_t>{0}, CUDNN_TYPE_INT32, type, requested, count, out);
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: {
      const std::string j = plan_json(d);
      return answer(std::vector<char>(j.c_str(), j.c_str() + j.size() + 1), CUDNN_TYPE_CHAR, type, requested, count,
                    out);
    }
    default: break;
  }
  // Anything else: what was set.
  const Attribute* a = find(d, name);
  if (!a)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, format("GetAttribute: attribute %d is not set or not modelled", name));
  if (a->type != type) return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, format("GetAttribute: attribute %d", name));
  if (count) *count = a->count;
  if (out) std::memcpy(out, a->bytes.data(), std::min<int64_t>(requested, a->count) * attribute_size(type));
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace
}  // namespace yuan::emu

using namespace yuan::emu;

size_t cudnnGetVersion() { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN (not modelled by the emulator)";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || !max_size) return;
  std::snprintf(message, max_size, "%s", t_last_error.c_str());
  t_last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate: null handle pointer");
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  Lock lock(mutex());
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnSetStream: null handle");
  if (!valid_stream(stream)) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a live stream");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  if (!handle || !stream) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetStream: null argument");
  *stream = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor) {
  if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendCreateDescriptor: null pointer");
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      break;
    default:
      *descriptor = nullptr;
      return fail(CUDNN_STATUS_NOT_SUPPORTED, format("descriptor type %d is not modelled", type));
  }
  *descriptor = new Desc(type);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  delete as_desc(descriptor);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendSetAttribute: null descriptor");
  Desc& d = *as_desc(descriptor);
  if (d.finalized) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: the descriptor is finalized");
  if (count < 0 || (count > 0 && !values))
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendSetAttribute: no values");
  Attribute a{type, count, std::vector<char>(count * attribute_size(type))};
  if (count) std::memcpy(a.bytes.data(), values, a.bytes.size());
  d.attributes[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                       void* values) {
  if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendGetAttribute: null descriptor");
  const Desc& d = *as_desc(descriptor);
  if (!d.finalized && d.attributes.find(name) == d.attributes.end())
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendGetAttribute: the descriptor is not finalized");
  return get_attribute(d, name, type, requested, count, values);
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  if (!descriptor) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnBackendFinalize: null descriptor");
  Desc& d = *as_desc(descriptor);
  if (d.finalized) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: finalized already");
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: s = finalize_tensor(d); break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: s = finalize_pointwise_op(d); break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: s = finalize_matmul_op(d); break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: s = finalize_reduction_op(d); break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: s = finalize_reshape_op(d); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: s = finalize_graph(d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      std::vector<Desc*> g;
      s = descriptors(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, "ENGINEHEUR_OPERATION_GRAPH", &g);
      if (!s && !find(d, CUDNN_ATTR_ENGINEHEUR_MODE)) s = fail(CUDNN_STATUS_BAD_PARAM, "ENGINEHEUR_MODE is not set");
      if (!s) d.graph = g[0]->graph;
      break;
    }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: s = finalize_engine(d); break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: s = finalize_engine_config(d); break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: s = finalize_plan(d); break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: s = finalize_variant_pack(d); break;
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR:
      s = fail(CUDNN_STATUS_NOT_SUPPORTED, "engine 0 has no knobs");
      break;
    default: s = finalize_plain(d); break;
  }
  d.finalized = s == CUDNN_STATUS_SUCCESS;
  return s;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  Lock lock(mutex());
  Calling calling("cudnnBackendExecute", __builtin_return_address(0));  // names the graph in race reports
  if (!handle || !plan || !pack) return refuse_execute(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "a null argument");
  const Desc &p = *as_desc(plan), &v = *as_desc(pack);
  if (p.type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || v.type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    return refuse_execute(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "not an execution plan and a variant pack");
  if (!p.finalized || !v.finalized) return refuse_execute(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "not finalized");
  if (sticky_error()) return CUDNN_STATUS_EXECUTION_FAILED;
  if (!valid_stream(handle->stream)) return refuse_execute(CUDNN_STATUS_BAD_PARAM, "the handle's stream is not live");
  return execute(handle, p, v);
}

// The legacy filter API, which the frontend names only to reorder int8x32 convolution filters: not modelled.

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t*) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "the legacy filter API is not modelled");
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "the legacy filter API is not modelled");
}
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int,
                                         const int[]) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "the legacy filter API is not modelled");
}
cudnnStatus_t cudnnReorderFilterAndBias(cudnnHandle_t, const cudnnFilterDescriptor_t, cudnnReorderType_t, const void*,
                                        void*, int, const void*, void*) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "the legacy filter API is not modelled");
}
