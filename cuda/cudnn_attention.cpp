// Causal self-attention through cuDNN's fused SDPA engines, described with the cuDNN frontend's graph API (the
// header-only C++ layer over cuDNN's backend descriptors). The math is attention.cu's, stated in
// src/ops/reference_ops.h; this file only says where the tensors are:
//   qkv [B, T, 3, NH, hs] bf16: Q, K, V as [B, NH, T, hs] views with strides {3CT, hs, 3C, 1} at offsets 0, C, 2C
//   out [B, T, NH, hs] bf16:    O as [B, NH, T, hs], strides {CT, hs, C, 1}
//   lse [B, NH, T] fp32:        cuDNN's stats, [B, NH, T, 1], strides {NH T, T, 1, 1}: log of the softmax's sum
//                               plus its max, natural log, which is what attention.cu keeps too
// with the causal mask (row t sees keys 0..t, cuDNN's diagonal band with right bound 0 from the top left), the
// scale 1/sqrt(hs) passed by value, and the backward's dqkv strided like qkv. The backward is cuDNN's deterministic
// one, so fixed-seed runs repeat.
//
// A graph is built once per shape and direction and cached: building runs cuDNN's heuristics and compiles its
// kernels (tens of milliseconds and more), executing is a launch. The graphs ask for a workspace, which comes from
// the caller (the attention's scratch in the memory plan, cudnn_attention_workspace_bytes).
//
// The GPU build loads libcudnn.so.9 at run time (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so a machine without
// cuDNN still runs, with attention.cu; the emulator's build links the frontend to the emulated cuDNN of
// cuda/emu/cudnn.cpp, which interprets the same graphs and refuses what cuDNN refuses.
#include "cudnn_attention.h"

#include "cuda_check.h"
#include "kernel_account.cuh"

#include <cmath>
#include <tuple>

#ifdef YUAN_CUDNN
#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <cudnn_frontend.h>
#endif

namespace yuan::gpu {

bool CudnnGraphFaults::operator<(const CudnnGraphFaults& o) const {
  return std::tie(head_time_strides_swapped, no_causal_mask, no_stats_to_backward) <
         std::tie(o.head_time_strides_swapped, o.no_causal_mask, o.no_stats_to_backward);
}

size_t cudnn_attention_workspace_bytes(int B, int T, int C, int NH) {
  const size_t rows = static_cast<size_t>(B) * NH * T;
  return 2 * (rows * static_cast<size_t>(C / NH) * sizeof(float) + rows * sizeof(float));
}

#ifndef YUAN_CUDNN

std::string cudnn_attention_problem(int, int, bool) {
  return "this build has no cuDNN (the cuDNN frontend's headers or cuDNN's were not found at build time: make deps "
         "fetches the frontend; CUDNN_HOME names cuDNN)";
}
std::string cudnn_attention_library() { return ""; }
void cudnn_attention_forward(bf16*, float*, const bf16*, int, int, int, int, void*, size_t, cudaStream_t,
                             const CudnnGraphFaults&) {
  throw Error(cudnn_attention_problem(0, 0));
}
void cudnn_attention_backward(bf16*, const bf16*, const bf16*, const bf16*, const float*, int, int, int, int, void*,
                              size_t, cudaStream_t, const CudnnGraphFaults&) {
  throw Error(cudnn_attention_problem(0, 0));
}

#else

namespace fe = cudnn_frontend;

#ifdef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
}  // namespace yuan::gpu
// The frontend's dynamic loading finds cuDNN's entry points in this handle (its contract: the program opens it).
void* cudnn_frontend::cudnn_dlhandle = nullptr;
namespace yuan::gpu {
#endif

namespace {

constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kdO = 6, kdQ = 7, kdK = 8, kdV = 9;

// The library, opened once: "" or why it cannot be used.
const std::string& library_problem() {
  static const std::string problem = [] () -> std::string {
#ifdef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!cudnn_frontend::cudnn_dlhandle) return strf("libcudnn.so.9 is not loadable (%s)", dlerror());
#endif
    const size_t v = fe::detail::get_backend_version();
    if (v < 90500) return strf("cuDNN %zu.%zu.%zu is older than 9.5, which the frontend's SDPA needs", v / 10000,
                               v / 100 % 100, v % 100);
    return "";
  }();
  return problem;
}

// CUDNN_CHECK's words (cuda_check.h): the frontend's error_t carries the frontend's and cuDNN's.
std::string cudnn_failure(fe::error_t e) { return e.is_bad() ? e.get_message() : ""; }
std::string cudnn_failure(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS ? "" : fe::detail::get_error_string(s); }

// One handle per thread that calls (cuDNN handles are not to be shared between threads), bound to the stream of
// each call.
cudnnHandle_t handle_for(cudaStream_t s) {
  struct Handle {
    cudnnHandle_t h = nullptr;
    ~Handle() {
      if (h) fe::detail::destroy_handle(h);
    }
  };
  thread_local Handle handle;
  // Through the frontend's shim, which calls the library it loaded (the GPU build) or the one linked (the emulator).
  if (!handle.h) CUDNN_CHECK(fe::detail::create_handle(&handle.h));
  CUDNN_CHECK(fe::detail::set_stream(handle.h, s));
  return handle.h;
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                     std::vector<int64_t> dim, std::vector<int64_t> stride) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

// The graph of one shape and direction, built on first use.
const Built& graph_for(bool backward, int B, int T, int C, int NH, const CudnnGraphFaults& faults,
                       cudnnHandle_t handle) {
  static std::mutex mu;
  static std::map<std::tuple<bool, int, int, int, int, CudnnGraphFaults>, Built> cache;
  const std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({backward, B, T, C, NH, faults});
  if (!fresh) return it->second;
  try {
    const int64_t hs = C / NH, b = B, t = T, h = NH, c = C;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const std::vector<int64_t> qkv_stride = faults.head_time_strides_swapped
                                                ? std::vector<int64_t>{3 * c * t, 3 * c, hs, 1}
                                                : std::vector<int64_t>{3 * c * t, hs, 3 * c, 1};
    const std::vector<int64_t> o_stride{c * t, hs, c, 1}, dim{b, h, t, hs};
    auto Q = tensor(*g, "Q", kQ, dim, qkv_stride), K = tensor(*g, "K", kK, dim, qkv_stride),
         V = tensor(*g, "V", kV, dim, qkv_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    if (!backward) {
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("attention_forward")
                      .set_generate_stats(true)
                      .set_causal_mask(!faults.no_causal_mask)
                      .set_attn_scale(scale)
                      .set_implementation(fe::AttentionImplementation_t::COMPOSITE);
      auto [O, stats] = g->sdpa(Q, K, V, opts);
      O->set_output(true).set_uid(kO).set_dim(dim).set_stride(o_stride);
      stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({b, h, t, 1}).set_stride(
          {h * t, t, 1, 1});
    } else {
      auto O = tensor(*g, "O", kO, dim, o_stride), dO = tensor(*g, "dO", kdO, dim, o_stride);
      auto stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("stats")
                                 .set_uid(kStats)
                                 .set_dim({b, h, t, 1})
                                 .set_stride({h * t, t, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opts = fe::graph::SDPA_backward_attributes()
                      .set_name("attention_backward")
                      .set_causal_mask(!faults.no_causal_mask)
                      .set_attn_scale(scale)
                      .set_deterministic_algorithm(true);
      auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
      dQ->set_output(true).set_uid(kdQ).set_dim(dim).set_stride(qkv_stride);
      dK->set_output(true).set_uid(kdK).set_dim(dim).set_stride(qkv_stride);
      dV->set_output(true).set_uid(kdV).set_dim(dim).set_stride(qkv_stride);
    }
    CUDNN_CHECK(g->validate());
    CUDNN_CHECK(g->build_operation_graph(handle));
    CUDNN_CHECK(g->create_execution_plans({fe::HeurMode_t::A}));
    CUDNN_CHECK(g->check_support(handle));
    CUDNN_CHECK(g->build_plans(handle));
    CUDNN_CHECK(g->get_workspace_size(it->second.workspace));
    it->second.graph = std::move(g);
  } catch (...) {
    cache.erase(it);  // a later call tries again and reports again
    throw;
  }
  return it->second;
}

void run(bool backward, int B, int T, int C, int NH, std::unordered_map<int64_t, void*> pointers, void* workspace,
         size_t workspace_bytes, cudaStream_t s, const CudnnGraphFaults& faults) {
  YUAN_CHECK(library_problem().empty(), "cuda attention: cuDNN: %s", library_problem().c_str());
  const cudnnHandle_t handle = handle_for(s);
  const Built& built = graph_for(backward, B, T, C, NH, faults, handle);
  if (backward && faults.no_stats_to_backward) pointers.erase(kStats);
  YUAN_CHECK(static_cast<size_t>(built.workspace) <= workspace_bytes,
             "cuda attention: cuDNN's %s graph at B %d, T %d, C %d, NH %d asks for %lld bytes of workspace, more than "
             "the %zu of the memory plan (cudnn_attention_workspace_bytes in cuda/cudnn_attention.cpp)",
             backward ? "backward" : "forward", B, T, C, NH, static_cast<long long>(built.workspace), workspace_bytes);
  // One library call for the kernel account (kernel_account.cuh), under the op's scope that cuda_ops.cu opened.
  timed(backward ? "cudnn sdpa backward" : "cudnn sdpa forward", s,
        [&] { CUDNN_CHECK(built.graph->execute(handle, pointers, workspace)); });
}

}  // namespace

std::string cudnn_attention_problem(int head_size, int seq_len, bool planning) {
  if (head_size % 8 != 0 || head_size > kCudnnMaxHeadSize)
    return strf("cuDNN's fused attention takes head sizes that are multiples of 8 up to %d (this model's is %d)",
                kCudnnMaxHeadSize, head_size);
  if (seq_len < 2) return "the cuDNN frontend refuses the backward of a single position (model.seq_len 1)";
  if (planning) return "";
  if (!library_problem().empty()) return library_problem();
  int dev = 0;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major < 8) return strf("cuDNN's fused attention needs sm_80 or newer (device %d is sm_%d%d)", dev, prop.major,
                                  prop.minor);
  return "";
}

std::string cudnn_attention_library() {
  const size_t v = library_problem().empty() ? fe::detail::get_backend_version() : 0;
  if (!v) return "";
  return strf("cuDNN %zu.%zu.%zu, frontend %d.%d.%d", v / 10000, v / 100 % 100, v % 100, CUDNN_FRONTEND_MAJOR_VERSION,
              CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
}

void cudnn_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, void* workspace,
                             size_t workspace_bytes, cudaStream_t s, const CudnnGraphFaults& faults) {
  auto* q = const_cast<bf16*>(qkv);  // the frontend's variant pack takes void*; nothing here writes qkv
  run(false, B, T, C, NH, {{kQ, q}, {kK, q + C}, {kV, q + 2 * C}, {kO, out}, {kStats, lse}}, workspace,
      workspace_bytes, s, faults);
}

void cudnn_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B,
                              int T, int C, int NH, void* workspace, size_t workspace_bytes, cudaStream_t s,
                              const CudnnGraphFaults& faults) {
  auto* q = const_cast<bf16*>(qkv);
  run(true, B, T, C, NH,
      {{kQ, q}, {kK, q + C}, {kV, q + 2 * C}, {kO, const_cast<bf16*>(out)}, {kdO, const_cast<bf16*>(dout)},
       {kStats, const_cast<float*>(lse)}, {kdQ, dqkv}, {kdK, dqkv + C}, {kdV, dqkv + 2 * C}},
      workspace, workspace_bytes, s, faults);
}

#endif  // YUAN_CUDNN

}  // namespace yuan::gpu
