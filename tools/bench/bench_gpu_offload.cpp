// ZeRO-Offload on one GPU: the GPT program on the CUDA backend with the host optimizer (optim/zero.h, zero 1 on a one-rank local
// communicator, no MPI), as the trainer runs it. Per step: compute (forward and backward, the gradient copies to
// pinned host memory running beside the last backward), exposed communication (waiting for those copies), and
// exposed optimizer (norm, CPU AdamW, weight upload; with the delayed update: waiting for the previous update and
// uploading it), plus the CPU AdamW's own time, its share of the step and how much of it is hidden.
//
//   1. gpt-xl (24 layers, 16 heads, 2048 wide, seq 1024): MFU with offload, delayed update off and on.
//   2. yuan-4.7b (40/24/3072, seq 2048, vocab 53248), recompute, micro-batch 1: tokens/s and the time for 1B tokens.
//   3. The largest model at width 4096 (32 heads, seq 2048, vocab 53248, recompute, micro-batch 1) whose memory
//      plan fits this GPU and whose host state fits this machine's available memory; then a few steps of it.
//
// MFU counts model FLOPs (gpt.h's flops_per_token: recomputation does not raise it) against the device's dense
// bf16 peak from NVIDIA's datasheet (cuda_peak_flops: 989 TFLOP/s on an H100 SXM; stated, not measured).
// Lines starting with RESULT are JSON.
//
// usage: bench_gpu_offload [--steps N] [--accum A] [--only xl|yuan|largest]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifdef YUAN_CUDA
#include "backend/cuda_backend.h"
#include "comm/communicator.h"
#include "model/gpt.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "util/error.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/rng.h"
#endif

#ifndef YUAN_CUDA
int main() {
  std::printf("bench_gpu_offload: built without CUDA, nothing to measure\n");
  return 0;
}
#else
using namespace yuan;

namespace {

constexpr double kGiB = 1073741824.0;
constexpr double kGoalMfu = 0.40, kGoalExposedOptim = 0.10;

struct Options {
  int steps = 3;
  int accum = 8;
  std::string only;
};

// GPT-2's init draws every weight serially with Box-Muller (~90 s for 4.7B parameters, longer than the timed
// steps). Timing needs only a model that trains stably: matrices uniform with GPT-2's std 0.02 from a
// counter-based generator, in parallel; LayerNorm gains 1, biases 0, as in init_gpt2.
std::vector<float> quick_init(const ParamLayout& layout) {
  std::vector<float> p(layout.total());
  for (size_t ti = 0; ti < layout.tensors().size(); ti++) {
    const TensorSpec& t = layout.tensors()[ti];
    float* q = p.data() + t.offset;
    if (t.shape.size() == 1) {
      const bool gain = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      std::fill(q, q + t.numel, gain ? 1.0f : 0.0f);
      continue;
    }
    const float half_width = 0.02f * std::sqrt(3.0f);
    const size_t chunk = size_t(1) << 20;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (t.numel + chunk - 1) / chunk; c++) {
      Rng rng(ti, c);
      for (size_t j = c * chunk; j < std::min(t.numel, (c + 1) * chunk); j++)
        q[j] = (2.0f * rng.next_uniform() - 1.0f) * half_width;
    }
  }
  return p;
}

// util/memory's reading, which the trainer's memory checks use too (MemAvailable and the cgroup's room).
size_t mem_available_bytes() { return node_available_memory().available; }

// Host bytes the trainer needs for a model on one rank: the full fp32 init (freed after the optimizer took its
// shard), the optimizer state, and the pinned bf16 staging of the delayed update.
size_t host_plan_bytes(size_t n, bool delayed) {
  return 4 * n + zero_optimizer_bytes(n, delayed) + (delayed ? 2 * n : 0);
}

// Device bytes of the model at micro-batch B (program/program.h's plan).
size_t device_plan_bytes(const GPTConfig& c, int B, bool recompute) {
  return plan_memory(Device::Cuda, c, {{}, B, 1, recompute}, ParamLayout(c).total()).total();
}

struct Measured {
  double step = 0, compute = 0, comm = 0, optim = 0, adamw = 0;
};

// Builds backend and optimizer, runs 2 warm-up steps (the delayed update needs two to reach its steady state),
// then `steps` timed ones with `accum` micro-batches each; averages.
Measured run(const GPTConfig& c, int B, bool recompute, bool delayed, int accum, int steps) {
  const ParamLayout layout(c);
  const ProgramSpec spec{{}, B, 1, recompute};
  check_memory(Device::Cuda, c, spec, layout.total(), cuda_free_bytes());
  auto comm = make_local_communicator();
  OptimConfig oc;
  oc.zero = ZeroStage(1);
  oc.lr = 1e-4;
  oc.delayed_update = delayed;
  Replica r;
  {
    const std::vector<float> init = quick_init(layout);
    assemble_replica(r, {Device::Cuda, layout, backend_spec(layout), spec}, [&](Replica& rr) -> Communicator* {
      rr.opts->add(std::make_unique<ZeroOptimizer>(oc, *rr.backend, layout, *comm, init.data()));
      return nullptr;
    });
  }
  Program& program = *r.program;
  ZeroOptimizers* opt = r.opts.get();
  std::vector<int32_t> tok(static_cast<size_t>(B) * (c.seq_len + 1));
  Rng rng(3, 0);
  for (auto& t : tok) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(c.vocab_size));
  Measured sum;
  for (int s = 0; s < 2 + steps; s++) {
    const double t0 = now_seconds();
    for (int k = 0; k < accum; k++) {
      if (k == accum - 1) opt->before_last_micro_batch();
      program.forward_backward(tok.data(), B, 1.0f / accum, opt->ready_hook());
      opt->after_micro_batch();
    }
    const double t1 = now_seconds();
    const ZeroStepStats st = end_step(*opt, *comm, oc.lr);
    const double t2 = now_seconds();
    if (s < 2) continue;
    YUAN_CHECK(!st.skipped, "step %d skipped: gradient norm %g", s, st.grad_norm);
    sum.step += t2 - t0;
    sum.compute += t1 - t0;
    sum.comm += st.comm_seconds;
    sum.optim += st.optim_seconds;
    // Without the delay the AdamW is all inside optim_seconds; the norm and upload are small beside it.
    sum.adamw += delayed ? st.background_seconds : st.optim_seconds;
  }
  opt->drain();
  for (double* x : {&sum.step, &sum.compute, &sum.comm, &sum.optim, &sum.adamw}) *x /= steps;
  return sum;
}

void report(const char* name, const GPTConfig& c, int B, bool recompute, bool delayed, int accum, const Measured& m) {
  const size_t n = ParamLayout(c).total();
  const double tokens = static_cast<double>(B) * accum * c.seq_len;
  const double tok_s = tokens / m.step;
  const PeakFlops peak = cuda_peak_flops();
  const double mfu = tok_s * flops_per_token(c, n) / peak.flops;
  const double compute_mfu = tokens / m.compute * flops_per_token(c, n) / peak.flops;
  const double exposed_optim = m.optim / m.step;
  const double hidden = m.adamw > 0 ? std::max(0.0, 1.0 - m.optim / m.adamw) : 0.0;
  std::printf("%s (%.2fB params, B=%d x accum %d, T=%d, recompute %s, delayed update %s):\n"
              "  step %.3f s = compute %.3f + exposed comm %.3f + exposed optimizer %.3f (+ %.3f other)\n"
              "  CPU AdamW %.3f s = %.1f%% of the step, %.0f%% of it hidden\n"
              "  %.0f tokens/s, MFU %.3f (compute alone %.3f) of %.0f TFLOP/s (%s); 1B tokens in %.1f h\n",
              name, n / 1e9, B, accum, c.seq_len, recompute ? "on" : "off", delayed ? "on" : "off", m.step, m.compute,
              m.comm, m.optim, m.step - m.compute - m.comm - m.optim, m.adamw, 100 * m.adamw / m.step, 100 * hidden,
              tok_s, mfu, compute_mfu, peak.flops / 1e12, peak.source.c_str(), 1e9 / tok_s / 3600);
  std::printf("  goals: MFU %.3f / %.2f = %.2f (>= 1 met); exposed optimizer %.1f%% / %.0f%% = %.2f (<= 1 met)\n", mfu,
              kGoalMfu, mfu / kGoalMfu, 100 * exposed_optim, 100 * kGoalExposedOptim,
              exposed_optim / kGoalExposedOptim);
  const nlohmann::ordered_json result = {
      {"name", name}, {"params", n}, {"B", B}, {"accum", accum}, {"seq_len", c.seq_len},
      {"recompute", static_cast<int>(recompute)}, {"delayed", static_cast<int>(delayed)}, {"step_s", m.step},
      {"compute_s", m.compute}, {"comm_s", m.comm}, {"optim_s", m.optim}, {"adamw_s", m.adamw},
      {"tokens_per_s", tok_s}, {"mfu", mfu}, {"hours_per_1b_tokens", 1e9 / tok_s / 3600}};
  std::printf("RESULT %s\n", result.dump().c_str());
  std::fflush(stdout);
}

// The largest micro-batch of 16, 8, ... 1 whose device memory plan fits.
int largest_micro_batch(const GPTConfig& c, bool recompute, size_t free_bytes) {
  for (int B = 16; B >= 1; B /= 2)
    if (device_plan_bytes(c, B, recompute) <= free_bytes) return B;
  return 0;
}

void bench_gpt_xl(const Options& o, size_t free_bytes) {
  const GPTConfig c{24, 16, 2048, 1024, 50257};
  const int B = largest_micro_batch(c, false, free_bytes);
  YUAN_CHECK(B > 0, "gpt-xl does not fit this GPU at micro-batch 1");
  for (bool delayed : {false, true}) {
    const size_t need = host_plan_bytes(ParamLayout(c).total(), delayed);
    if (need > mem_available_bytes()) {
      std::printf("gpt-xl delayed %d: needs %.1f GiB of host memory, %.1f GiB available; skipped\n", delayed,
                  need / kGiB, mem_available_bytes() / kGiB);
      continue;
    }
    report(delayed ? "gpt-xl-offload-delayed" : "gpt-xl-offload", c, B, false, delayed, o.accum,
           run(c, B, false, delayed, o.accum, o.steps));
  }
}

// The delayed update when the host holds it, else the plain one.
void bench_big(const char* name, const GPTConfig& c, const Options& o) {
  const size_t n = ParamLayout(c).total();
  if (host_plan_bytes(n, false) > mem_available_bytes()) {
    std::printf("%s: needs %.1f GiB of host memory, %.1f GiB available; skipped\n", name,
                host_plan_bytes(n, false) / kGiB, mem_available_bytes() / kGiB);
    return;
  }
  const bool delayed = host_plan_bytes(n, true) <= mem_available_bytes();
  std::printf("%s: %.2fB params, device plan %.1f GiB (recompute, B=1), host %.1f GiB (delayed update %s), %.1f GiB "
              "available\n", name, n / 1e9, device_plan_bytes(c, 1, true) / kGiB,
              host_plan_bytes(n, delayed) / kGiB, delayed ? "on" : "off", mem_available_bytes() / kGiB);
  std::fflush(stdout);
  report(name, c, 1, true, delayed, 2 * o.accum, run(c, 1, true, delayed, 2 * o.accum, o.steps));
}

void bench_largest(const Options& o, size_t free_bytes) {
  // Device: weights 2 + gradients 4 bytes per parameter plus activations; host: 20 bytes per parameter (init,
  // master, moments, gradient), so the host is the limit on a 128 GB machine. A 10% margin on each side.
  const size_t host = static_cast<size_t>(0.9 * mem_available_bytes());
  const size_t device = static_cast<size_t>(0.9 * free_bytes);
  GPTConfig best{};
  for (int L = 1; L <= 200; L++) {
    const GPTConfig c{L, 32, 4096, 2048, 53248};
    const size_t n = ParamLayout(c).total();
    if (device_plan_bytes(c, 1, true) > device || host_plan_bytes(n, false) > host) break;
    best = c;
  }
  YUAN_CHECK(best.n_layer > 0, "not even one layer at width 4096 fits");
  const size_t n = ParamLayout(best).total();
  std::printf("largest at width 4096: %d layers, %.2fB params (device plan %.1f of %.1f GiB free, host %.1f of %.1f "
              "GiB available, 10%% margins)\n", best.n_layer, n / 1e9, device_plan_bytes(best, 1, true) / kGiB,
              free_bytes / kGiB, host_plan_bytes(n, false) / kGiB, mem_available_bytes() / kGiB);
  std::fflush(stdout);
  report("largest-w4096", best, 1, true, false, 2 * o.accum, run(best, 1, true, false, 2 * o.accum, o.steps));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      o.steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--accum") && i + 1 < argc)
      o.accum = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      o.only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--accum A] [--only xl|yuan|largest]\n", argv[0]);
      return 2;
    }
  }
  if (!cuda_device_available()) {
    std::printf("bench_gpu_offload: no CUDA device, nothing to measure\n");
    return 0;
  }
  const size_t free_bytes = cuda_free_bytes();
  std::printf("# %.1f GiB GPU memory free, %.1f GiB host memory available, accum %d, %d timed steps\n",
              free_bytes / kGiB, mem_available_bytes() / kGiB, o.accum, o.steps);
  try {
    if (o.only.empty() || o.only == "xl") bench_gpt_xl(o, free_bytes);
    if (o.only.empty() || o.only == "yuan") bench_big("yuan-4.7b", GPTConfig{40, 24, 3072, 2048, 53248}, o);
    if (o.only.empty() || o.only == "largest") bench_largest(o, free_bytes);
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
#endif
