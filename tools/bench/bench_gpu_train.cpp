// GPU training throughput: real training steps (the GPT program's forward_backward on the CUDA backend,
// global-norm clipping and the GPU AdamW, one GPU) on random tokens, as tokens/s and MFU against the device's dense bf16 tensor-core peak from
// NVIDIA's datasheet (cuda_peak_flops: 989 TFLOP/s on an H100 SXM; stated, not measured). MFU counts model FLOPs (gpt.h's flops_per_token), so
// recomputation does not raise it. Each config runs at the largest micro-batch of 32, 16, ... 1 whose backend
// and optimizer state fit, with the attention kernels --attention asks for as model.attention does (auto: cuDNN's
// fused attention where it runs the shape, else own; the line names the path taken). Lines starting with RESULT are
// JSON for tools/bench/run_bench_gpu.sh.
//
// usage: bench_gpu_train [--steps N] [--recompute] [--attention auto|cudnn|own] [--only NAME]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <nlohmann/json.hpp>
#include <vector>

#ifdef YUAN_CUDA
#include "backend/cuda_adamw.h"
#include "backend/cuda_backend.h"
#include "config/config.h"
#include "model/gpt.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "util/error.h"
#include "util/log.h"
#include "util/rng.h"
#endif

#ifndef YUAN_CUDA
int main() {
  std::printf("bench_gpu_train: built without CUDA, nothing to measure\n");
  return 0;
}
#else
using namespace yuan;


struct Bench {
  const char* name;
  GPTConfig cfg;
};

// One training step as the trainer will do it with optim.offload=none.
static void train_step(Program& program, CudaAdamW& opt, const std::vector<int32_t>& tok, int B, int64_t t) {
  OptimConfig oc;
  oc.lr = 1e-4;
  program.forward_backward(tok.data(), B, 1.0f, nullptr);
  opt.step(adamw_hyper(oc, oc.lr, t, std::sqrt(opt.grad_sum_squares())));
  program.backend().zero_grads(0, program.backend().size());
}

static void run(const Bench& b, int steps, bool recompute, AttentionKernels attention, const PeakFlops& peak) {
  GPTConfig c = b.cfg;
  c.attention = attention;
  const ParamLayout layout(c);
  const AttentionChoice path = choose_attention(Device::Cuda, c);
  std::vector<float> init(layout.total());
  init_gpt2(layout, 1, init.data());
  for (int B = 32; B >= 1; B /= 2) {
    std::vector<int32_t> tok(static_cast<size_t>(B) * (c.seq_len + 1));
    Rng rng(3, 0);
    for (auto& t : tok) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(c.vocab_size));
    try {
      const ProgramSpec spec{{}, B, 1, recompute, 1, path.path};
      check_memory(Device::Cuda, c, spec, layout.total(), cuda_free_bytes());
      BackendSpec backend = backend_spec(layout);
      backend.attention = path.path;
      Replica r;
      assemble_replica(r, {Device::Cuda, layout, backend, spec, init.data()});
      Program& program = *r.program;
      CudaAdamW opt(*r.backend, 0, layout.total(), init.data(), decay_segments(layout, 0, layout.total()));
      for (int w = 1; w <= 2; w++) train_step(program, opt, tok, B, w);  // GEMM plans, module load, allocator
      const double t0 = now_seconds();
      for (int s = 0; s < steps; s++) train_step(program, opt, tok, B, 3 + s);
      const double dt = (now_seconds() - t0) / steps;
      const double tok_s = static_cast<double>(B) * c.seq_len / dt;
      const double mfu = tok_s * flops_per_token(c, layout.total()) / peak.flops;
      std::printf("train %-12s (%6.1fM params, B=%d, T=%d, recompute %s, attention %s): %9.0f tokens/s, %7.1f "
                  "ms/step, MFU %.3f of %.0f TFLOP/s\n", b.name, layout.total() / 1e6, B, c.seq_len,
                  recompute ? "on" : "off", attention_path_name(path.path), tok_s, 1000 * dt, mfu, peak.flops / 1e12);
      const nlohmann::ordered_json result = {
          {"name", b.name}, {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
          {"seq_len", c.seq_len}, {"vocab_size", c.vocab_size}, {"B", B}, {"attention", attention_path_name(path.path)},
          {"tokens_per_s", tok_s}, {"mfu", mfu}};
      std::printf("RESULT %s\n", result.dump().c_str());
      std::fflush(stdout);
      return;
    } catch (const Error& e) {
      std::printf("  %s at B=%d does not fit: %s\n", b.name, B, e.what());
    }
  }
  std::printf("train %-12s: does not fit at micro-batch 1\n", b.name);
}

int main(int argc, char** argv) {
  int steps = 10;
  bool recompute = false;
  std::string attention_text = "auto", only;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--recompute"))
      recompute = true;
    else if (!std::strncmp(argv[i], "--attention=", 12))
      attention_text = argv[i] + 12;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--recompute] [--attention=auto|cudnn|own] [--only NAME]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::optional<AttentionKernels> attention = from_name<AttentionKernels>(attention_text);
  if (!attention) {
    std::fprintf(stderr, "%s: --attention must be %s (got '%s')\n", argv[0], names_listed<AttentionKernels>().c_str(),
                 attention_text.c_str());
    return 2;
  }
  if (!cuda_device_available()) {
    std::printf("bench_gpu_train: no CUDA device, nothing to measure\n");
    return 0;
  }
  const Bench benches[] = {{"gpt-small", {12, 12, 768, 1024, 50257}},
                           {"gpt-xl-1024", {24, 16, 2048, 1024, 50257}},
                           {"gpt-xl-2048", {24, 16, 2048, 2048, 50257}}};
  const PeakFlops peak = cuda_peak_flops();
  std::printf("peak: %.0f TFLOP/s (%s)\n", peak.flops / 1e12, peak.source.c_str());
  try {
    for (const Bench& b : benches)
      if (only.empty() || only == b.name) run(b, steps, recompute, *attention, peak);
  } catch (const Error& e) {  // --attention=cudnn where cuDNN's attention does not run
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
#endif
