// AdamW throughput on 64M parameters. The fused kernel touches p, m, v (read+write) and g (read): 28 bytes per
// parameter, so its ceiling is a streaming kernel moving exactly those bytes; PyTorch's CPU AdamW
// (tools/bench/adamw_torch.py, same size and threads) is the peer. Also prints the ZeRO-1 optimizer memory per
// rank from the optimizer's own accounting.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "model/gpt.h"
#include "ops/adamw.h"
#include "optim/zero.h"
#include "util/error.h"
#include "util/log.h"
#include "util/memory.h"

using namespace yuan;

namespace {

constexpr size_t kN = size_t(64) << 20;
constexpr int kReps = 15;
constexpr double kBytesPerParam = 7 * sizeof(float);

// Best of kReps for each kernel, the two interleaved so that a noisy neighbour hurts both alike.
void best_seconds(const std::function<void()>& a, const std::function<void()>& b, double& ta, double& tb) {
  a();  // first touch, page faults
  b();
  ta = tb = 1e30;
  for (int r = 0; r < kReps; r++) {
    double t0 = now_seconds();
    a();
    double t1 = now_seconds();
    b();
    ta = std::min(ta, t1 - t0);
    tb = std::min(tb, now_seconds() - t1);
  }
}

// Same streams and schedule as the fused kernel, no arithmetic to speak of: the memory-bandwidth limit.
void stream_kernel(float* p, float* m, float* v, const float* g, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

// PyTorch's Mparam/s, or a negative value when the peer could not run.
double torch_mparams(int threads) {
  std::string cmd = strf("/usr/bin/python3 tools/bench/adamw_torch.py --n %zu --threads %d 2>&1", kN, threads);
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  double rate = -1;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "mparams_per_s %lf", &rate) != 1) std::fputs(line, stdout);
  }
  return pclose(f) == 0 ? rate : -1;
}

void memory_table() {
  struct Model {
    const char* name;
    GPTConfig cfg;
  };
  const Model models[] = {{"gpt-small", {12, 12, 768, 1024, 50257}}, {"yuan-4.7b", {40, 24, 3072, 2048, 53248}}};
  for (const Model& m : models) {
    size_t n = ParamLayout(m.cfg).total();
    std::string row = strf("zero-1 optimizer memory of rank 0 (the largest shard), %s (%.1fM params):", m.name,
                           n / 1e6);
    for (int world : {1, 8, 64})
      row += strf("  N=%d %.3f GiB", world,
                  zero_optimizer_bytes(zero_shard(n, world, 0, ZeroStage(1)).count) / 1073741824.0);
    std::printf("%s\n", row.c_str());
  }
}

}  // namespace

int main() {
  const int threads = omp_get_max_threads();
  HostArray<float> p(kN, Mem::Optimizer), m(kN, Mem::Optimizer), v(kN, Mem::Optimizer), g(kN, Mem::Optimizer);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < kN; i++) {
    p[i] = 0.02f * static_cast<float>(static_cast<int>(i % 2001) - 1000) / 1000.0f;
    g[i] = 1e-3f * static_cast<float>(static_cast<int>((i * 7919) % 1999) - 999) / 999.0f;
  }
  ops::AdamWHyper h;
  h.lr = 1e-4;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  double t_fused, t_stream;
  best_seconds([&] { ops::adamw_update(p.data(), m.data(), v.data(), g.data(), nullptr, kN, h), h.t++; },
               [&] { stream_kernel(p.data(), m.data(), v.data(), g.data(), kN); }, t_fused, t_stream);
  double fused_rate = kN / t_fused / 1e6;
  std::printf("adamw fused: %.2f ms, %.0f Mparam/s, %.1f GB/s; streaming same bytes: %.2f ms, %.1f GB/s; "
              "ratio %.3f of bandwidth limit (goal >= 0.9), %d threads\n",
              t_fused * 1e3, fused_rate, kN * kBytesPerParam / t_fused / 1e9, t_stream * 1e3,
              kN * kBytesPerParam / t_stream / 1e9, t_stream / t_fused, threads);

  double torch_rate = torch_mparams(threads);
  if (torch_rate > 0)
    std::printf("adamw vs pytorch: %.0f vs %.0f Mparam/s, ratio %.2fx (goal >= 5x)\n", fused_rate, torch_rate,
                fused_rate / torch_rate);
  else
    std::printf("adamw vs pytorch: peer did not run (/usr/bin/python3 tools/bench/adamw_torch.py, from the repo root)\n");
  memory_table();
  return 0;
}
