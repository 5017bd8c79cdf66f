// CPU training throughput and GEMM efficiency, as ratios against this machine's FMA peak measured in the
// same run. Training steps are the real ones (CPU backend + ZeRO AdamW, one rank) on random tokens.
//
// usage: bench_train [--steps N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "ops/reference_ops.h"
#include "optim/replica.h"
#include "optim/zero.h"
#include "program/program.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/peak.h"
#include "util/rng.h"
#include "util/threads.h"

using namespace yuan;

static void bench_gemm(double peak) {
  struct Shape {
    int N, C, OC;
    const char* what;
  } shapes[] = {{8192, 768, 2304, "gpt-small qkv, 8x1024 tokens"},
                {8192, 768, 3072, "gpt-small fc"},
                {8192, 3072, 768, "gpt-small fc proj"},
                {1024, 128, 512, "tiny fc, 8x128 tokens"}};
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.N) * s.C, 0.01f), w(static_cast<size_t>(s.OC) * s.C, 0.02f),
        out(static_cast<size_t>(s.N) * s.OC);
    ops::matmul_forward(out.data(), a.data(), w.data(), nullptr, s.N, s.C, s.OC);  // warm-up, loads OpenBLAS
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
      double t0 = now_seconds();
      ops::matmul_forward(out.data(), a.data(), w.data(), nullptr, s.N, s.C, s.OC);
      double dt = now_seconds() - t0;
      if (dt < best) best = dt;
    }
    double gflops = 2.0 * s.N * s.C * s.OC / best / 1e9;
    std::printf("gemm %5dx%4dx%4d (%s): %7.1f GFLOP/s = %.2f x FMA peak\n", s.N, s.C, s.OC, s.what, gflops,
                gflops * 1e9 / peak);
  }
}

static void bench_model(const char* name, GPTConfig c, int B, int steps, double peak, Communicator& comm) {
  const ParamLayout layout(c);
  std::vector<float> init(layout.total());
  init_gpt2(layout, 1, init.data());
  OptimConfig oc;
  Replica r;
  const ReplicaSpec spec{Device::Cpu, layout, backend_spec(layout), {{}, B, 1, false}};
  assemble_replica(r, spec, [&](Replica& rr) -> Communicator* {
    rr.opts->add(std::make_unique<ZeroOptimizer>(oc, *rr.backend, layout, comm, init.data()));
    return nullptr;
  });
  Program& program = *r.program;
  ZeroOptimizers& opt = *r.opts;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (c.seq_len + 1));
  Rng rng(3, 0);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(c.vocab_size));
  double total = 0;
  for (int s = 0; s <= steps; s++) {
    double t0 = now_seconds();
    program.forward_backward(tokens.data(), B, 1.0f, opt.ready_hook());
    opt.after_micro_batch();
    end_step(opt, comm, 1e-4);
    if (s > 0) total += now_seconds() - t0;  // step 0 warms up
  }
  double tok_s = static_cast<double>(B) * c.seq_len * steps / total;
  double mfu = tok_s * flops_per_token(c, layout.total()) / peak;
  std::printf("train %-9s (%5.1fM params, B=%d, T=%d): %8.0f tokens/s, %.0f ms/step, MFU %.2f of FMA peak\n", name,
              layout.total() / 1e6, B, c.seq_len, tok_s, 1000 * total / steps, mfu);
}

int main(int argc, char** argv) {
  int steps = argc > 2 && !std::strcmp(argv[1], "--steps") ? std::atoi(argv[2]) : 3;
  int threads = configure_threads(1);
  double peak = measure_peak_flops(0.5);
  std::printf("threads %d, FMA peak %.1f GFLOP/s (fp32, measured)\n", threads, peak / 1e9);
  bench_gemm(peak);
  auto comm = make_local_communicator();
  bench_model("tiny", GPTConfig{4, 4, 128, 128, 4000}, 8, steps * 3, peak, *comm);
  bench_model("gpt-small", GPTConfig{12, 12, 768, 1024, 50304}, 1, steps, peak, *comm);
  return 0;
}
