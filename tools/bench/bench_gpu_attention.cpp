// Attention alone, forward and backward, on both of the CUDA backend's paths (model.attention): own
// (cuda/attention.cu) and cuDNN's fused SDPA (cuda/cudnn_attention.cpp), at the trainer's shapes: gpt-small's
// micro-batch as bench_gpu_train runs it (B 32 x T 1024, 12 heads of 64) and Yuan-4.7B's as bench_gpu_offload runs it
// (B 1 x T 2048, 24 heads of 128). Each pass as achieved TFLOP/s (the causal FLOPs of ops/op_cost.h
// attention_forward_cost / attention_backward_cost over its time) and that as a fraction of the device's dense bf16
// peak (cuda_peak_flops: the datasheet's, not measured), then cuDNN's time over own's. The times are CUDA events on
// the backend's stream around `iters` back-to-back calls, after `kWarmup` calls (cuDNN builds its graphs on the
// first). Where cuDNN's attention does not run here, own's alone, with choose_attention's reason. Lines starting
// with ATTENTION are JSON (bench_gpu_train's RESULT lines share their file in tools/bench/run_bench_gpu.sh).
//
// usage: bench_gpu_attention [--iters N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#ifdef YUAN_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "ops/op_cost.h"
#include "util/error.h"
#include "util/rng.h"
#endif

#ifndef YUAN_CUDA
int main() {
  std::printf("bench_gpu_attention: built without CUDA, nothing to measure\n");
  return 0;
}
#else
using namespace yuan;

namespace {

constexpr int kWarmup = 3;
constexpr ops::Widths kBf16{2, 2};  // the cuda backend's bf16 activations

struct Shape {
  const char* name;
  int B, T, C, NH;
};

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    YUAN_CHECK(e_ == cudaSuccess, "bench_gpu_attention: %s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

// Seconds per call, forward and backward, of one path at one shape.
struct Times {
  double forward = 0, backward = 0;
};
// One pass's line: its time, own's at the same shape, and its causal FLOPs.
struct Pass {
  const char* name;
  double seconds, own_seconds, flops;
};

// `n` bf16 values uniform in [-1, 1) into device memory `dst`, so that the scores spread as real activations' do
// (zeros would make every softmax uniform). Done before return: the copy is on the legacy stream, which does not
// order the backend's non-blocking one.
void fill(void* dst, size_t n, Rng& rng) {
  std::vector<__nv_bfloat16> host(n);
  for (auto& v : host) v = __float2bfloat16(2 * rng.next_uniform() - 1);
  CUDA_OK(cudaMemcpy(dst, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
}

Times measure(const Shape& s, AttentionPath path, int iters) {
  auto backend = make_backend(Device::Cuda, {0, false, s.C, path});
  const TensorFormats& f = tensor_formats(Device::Cuda);
  const int64_t BT = static_cast<int64_t>(s.B) * s.T;
  const auto device = [&](size_t bytes) { return backend->alloc(bytes, Mem::Activations); };
  const size_t bf = sizeof(__nv_bfloat16);
  const size_t state_n = f.attention_state(s.B, s.T, s.NH);
  const size_t scratch_n = f.attention_scratch(s.B, s.T, s.NH, s.C / s.NH, path);
  Allocation qkv_m = device(BT * 3 * s.C * bf), out_m = device(BT * s.C * bf), dout_m = device(BT * s.C * bf),
             dqkv_m = device(BT * 3 * s.C * bf), state_m = device(state_n * sizeof(float)),
             scratch_m = device(scratch_n * sizeof(float));
  Rng rng(7, 0);
  fill(qkv_m.as<void>(), BT * 3 * s.C, rng);
  fill(dout_m.as<void>(), BT * s.C, rng);
  const Tensor qkv(qkv_m.as<void>(), DType::BF16, BT, 3 * s.C), out(out_m.as<void>(), DType::BF16, BT, s.C),
      dout(dout_m.as<void>(), DType::BF16, BT, s.C), dqkv(dqkv_m.as<void>(), DType::BF16, BT, 3 * s.C),
      state(state_m.as<void>(), DType::F32, 1, static_cast<int64_t>(state_n)),
      scratch(scratch_m.as<void>(), DType::F32, 1, static_cast<int64_t>(scratch_n));
  Ops& ops = backend->ops();
  const auto forward = [&] { ops.attention_forward(out, state, scratch, qkv, s.B, s.T, s.NH); };
  const auto backward = [&] { ops.attention_backward(dqkv, scratch, dout, qkv, out, state, s.B, s.T, s.NH); };
  const cudaStream_t stream = backend->stream();
  cudaEvent_t begin, end;
  CUDA_OK(cudaEventCreate(&begin));
  CUDA_OK(cudaEventCreate(&end));
  // Seconds per call of `pass`, `iters` of them back to back after the warm-up.
  const auto time = [&](const auto& pass) {
    for (int i = 0; i < kWarmup; i++) pass();
    CUDA_OK(cudaEventRecord(begin, stream));
    for (int i = 0; i < iters; i++) pass();
    CUDA_OK(cudaEventRecord(end, stream));
    CUDA_OK(cudaEventSynchronize(end));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, begin, end));
    return 1e-3 * ms / iters;
  };
  forward();  // the state the backward reads
  const Times t{time(forward), time(backward)};
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N]\n", argv[0]);
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::printf("bench_gpu_attention: no CUDA device, nothing to measure\n");
    return 0;
  }
  const Shape shapes[] = {{"gpt-small", 32, 1024, 768, 12}, {"yuan-4.7b", 1, 2048, 3072, 24}};
  const PeakFlops peak = cuda_peak_flops();
  std::printf("peak: %.0f TFLOP/s (%s); %d timed calls after %d\n", peak.flops / 1e12, peak.source.c_str(), iters,
              kWarmup);
  try {
    for (const Shape& s : shapes) {
      const int hs = s.C / s.NH;
      const AttentionChoice cudnn = choose_attention(Device::Cuda, std::nullopt, hs, s.T);
      if (cudnn.path != AttentionPath::Cudnn) std::printf("%s: own only, %s\n", s.name, cudnn.why.c_str());
      const double flops_f = ops::attention_forward_cost(s.B, s.T, s.C, s.NH, kBf16).flops;
      const double flops_b = ops::attention_backward_cost(s.B, s.T, s.C, s.NH, kBf16).flops;
      Times own{};
      for (AttentionPath path : {AttentionPath::Own, AttentionPath::Cudnn}) {
        if (path == AttentionPath::Cudnn && cudnn.path != AttentionPath::Cudnn) continue;
        const Times t = measure(s, path, iters);
        if (path == AttentionPath::Own) own = t;
        nlohmann::ordered_json result = {{"name", s.name}, {"path", attention_path_name(path)}, {"B", s.B},
                                         {"T", s.T}, {"C", s.C}, {"NH", s.NH}};
        const Pass passes[] = {{"forward", t.forward, own.forward, flops_f}, {"backward", t.backward, own.backward,
                                                                               flops_b}};
        for (const Pass& p : passes) {
          const double tflops = p.flops / p.seconds / 1e12, of_peak = p.flops / p.seconds / peak.flops;
          const std::string against =
              path == AttentionPath::Cudnn ? strf(", %.2fx own's time", p.seconds / p.own_seconds) : "";
          std::printf("attention %-10s %-5s %-8s (B=%d, T=%d, %d heads of %d): %8.3f ms, %6.1f TFLOP/s, %.3f of "
                      "peak%s\n", s.name, attention_path_name(path), p.name, s.B, s.T, s.NH, hs, 1e3 * p.seconds,
                      tflops, of_peak, against.c_str());
          result[std::string(p.name) + "_ms"] = 1e3 * p.seconds;
          result[std::string(p.name) + "_tflops"] = tflops;
          result[std::string(p.name) + "_of_peak"] = of_peak;
        }
        if (path == AttentionPath::Cudnn) result["library"] = cudnn.why;
        std::printf("ATTENTION %s\n", result.dump().c_str());
        std::fflush(stdout);
      }
    }
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
#endif
