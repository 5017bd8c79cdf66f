// Fused softmax + cross-entropy over the vocabulary, gradient written over the logits.
//   loss = logsumexp(z) - z[y];   dz = scale * (softmax(z) - onehot(y))
#include <cmath>

#include "ops/ops.h"

namespace yuan::ops {

void classifier_forward_backward(float* logits, float* losses, const int32_t* targets, int B, int T, int V,
                                 int tgt_stride, float dlogits_scale) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      size_t row = static_cast<size_t>(b) * T + t;
      float* z = logits + row * V;
      int y = targets[static_cast<size_t>(b) * tgt_stride + t];
      float maxv = -INFINITY;
      for (int i = 0; i < V; i++) maxv = z[i] > maxv ? z[i] : maxv;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) sum += std::exp(z[i] - maxv);
      losses[row] = std::log(sum) + maxv - z[y];
      if (dlogits_scale == 0.0f) continue;
      float inv = 1.0f / sum;
#pragma omp simd
      for (int i = 0; i < V; i++) z[i] = dlogits_scale * std::exp(z[i] - maxv) * inv;
      z[y] -= dlogits_scale;
    }
}

}  // namespace yuan::ops
