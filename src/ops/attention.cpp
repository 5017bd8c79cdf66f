// Causal multi-head self-attention, one (batch, head) per task.
//   s[t,t2] = q[t].k[t2] / sqrt(hs)  for t2 <= t;   att[t,:] = softmax(s[t,:]);   out[t] = sum_t2 att[t,t2] v[t2]
//   backward: datt = dout . v;  dv += att dout;  ds = att * (datt - sum(att * datt));  dq += ds k / sqrt(hs);
//             dk += ds q / sqrt(hs)
#include <cmath>

#include "ops/reference_ops.h"

namespace yuan::ops {

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(C) * 3;
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float* base = qkv + static_cast<size_t>(b) * T * C3;
        const float* q = base + t * C3 + h * hs;
        float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = base + t2 * C3 + C + h * hs;
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int i = 0; i < hs; i++) s += q[i] * k[i];
          s *= scale;
          a[t2] = s;
          if (s > maxv) maxv = s;
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0;  // masked: keeps att a complete [T,T] matrix
        float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = base + t2 * C3 + 2 * C + h * hs;
          float w = a[t2];
#pragma omp simd
          for (int i = 0; i < hs; i++) o[i] += w * v[i];
        }
      }
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(C) * 3;
  // dk and dv of position t2 collect from every later query t, so a task owns a whole (batch, head).
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float* base = qkv + static_cast<size_t>(b) * T * C3;
      float* dbase = dqkv + static_cast<size_t>(b) * T * C3;
      for (int t = 0; t < T; t++) {
        const float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float* da = datt + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        const float* dy = dout + (static_cast<size_t>(b) * T + t) * C + h * hs;
        const float* q = base + t * C3 + h * hs;
        float* dq = dbase + t * C3 + h * hs;
        float dot = 0;  // sum_t2 att * datt
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = base + t2 * C3 + 2 * C + h * hs;
          float* dv = dbase + t2 * C3 + 2 * C + h * hs;
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int i = 0; i < hs; i++) {
            s += dy[i] * v[i];
            dv[i] += a[t2] * dy[i];
          }
          da[t2] = s;
          dot += a[t2] * s;
        }
        for (int t2 = 0; t2 <= t; t2++) {
          float ds = a[t2] * (da[t2] - dot) * scale;
          const float* k = base + t2 * C3 + C + h * hs;
          float* dk = dbase + t2 * C3 + C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; i++) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
}

}  // namespace yuan::ops
