// Fused softmax + cross-entropy over the vocabulary, gradient written over the logits.
//   loss = logsumexp(z) - z[y];   dz = scale * (softmax(z) - onehot(y))
#include <cmath>

#include "ops/reference_ops.h"

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

void classifier_row_max(const float* logits, float* row_max, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* z = logits + static_cast<size_t>(i) * V;
    float m = -INFINITY;
    for (int j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
    row_max[i] = m;
  }
}

void classifier_row_sums(const float* logits, const float* row_max, const int32_t* targets, int B, int T, int V,
                         int tgt_stride, int vocab_begin, float* sums) {
  const size_t N = static_cast<size_t>(B) * T;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const size_t row = static_cast<size_t>(b) * T + t;
      const float* z = logits + row * V;
      const float m = row_max[row];
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; j++) sum += std::exp(z[j] - m);
      const int y = targets[static_cast<size_t>(b) * tgt_stride + t] - vocab_begin;
      sums[row] = sum;
      sums[N + row] = y >= 0 && y < V ? z[y] : 0.0f;
    }
}

void classifier_parallel_finish(float* logits, float* losses, const float* row_max, const float* sums,
                                const int32_t* targets, int B, int T, int V, int tgt_stride, int vocab_begin,
                                float dlogits_scale) {
  const size_t N = static_cast<size_t>(B) * T;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const size_t row = static_cast<size_t>(b) * T + t;
      const float m = row_max[row], sum = sums[row];
      losses[row] = std::log(sum) + m - sums[N + row];
      if (dlogits_scale == 0.0f) continue;
      float* z = logits + row * V;
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int j = 0; j < V; j++) z[j] = dlogits_scale * std::exp(z[j] - m) * inv;
      const int y = targets[static_cast<size_t>(b) * tgt_stride + t] - vocab_begin;
      if (y >= 0 && y < V) z[y] -= dlogits_scale;
    }
}

}  // namespace yuan::ops
