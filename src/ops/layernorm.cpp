// LayerNorm over the last dimension, and the residual add that feeds it.
//   y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dy * w,  xhat = (x - mean) * rstd
#include <cmath>

#include "ops/reference_ops.h"

namespace yuan::ops {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = inp + static_cast<size_t>(i) * C;
    float* y = out + static_cast<size_t>(i) * C;
    float m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * w[c] + b[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    const float* x = inp + static_cast<size_t>(i) * C;
    const float* dy = dout + static_cast<size_t>(i) * C;
    float* dx = dinp + static_cast<size_t>(i) * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; c++) {
      float dn = w[c] * dy[c];
      dnorm_mean += dn;
      dnorm_norm_mean += dn * (x[c] - m) * s;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      dx[c] += s * (w[c] * dy[c] - dnorm_mean - xhat * dnorm_norm_mean);
    }
  }
  // Parameter gradients reduce over rows: split channels across threads so each sum has one owner.
  constexpr int kBlock = 16;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    int c1 = c0 + kBlock < C ? c0 + kBlock : C;
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int i = 0; i < N; i++) {
      const float* x = inp + static_cast<size_t>(i) * C;
      const float* dy = dout + static_cast<size_t>(i) * C;
      for (int c = c0; c < c1; c++) {
        acc_w[c - c0] += dy[c] * (x[c] - mean[i]) * rstd[i];
        acc_b[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; c++) {
      dw[c] += acc_w[c - c0];
      db[c] += acc_b[c - c0];
    }
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void bias_residual_add(float* out, const float* bias, const float* residual, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; i++) {
    float* o = out + static_cast<size_t>(i) * C;
    const float* r = residual + static_cast<size_t>(i) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] += bias[c] + r[c];
  }
}

}  // namespace yuan::ops
