// Token + position embedding. out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
#include "ops/reference_ops.h"

namespace yuan::ops {

void encoder_forward(float* out, const int32_t* tok, const float* wte, const float* wpe, int B, int T, int C,
                     int tok_stride, int vocab_begin, int vocab_rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const int64_t row = static_cast<int64_t>(tok[static_cast<size_t>(b) * tok_stride + t]) - vocab_begin;
      const float* e = row >= 0 && row < vocab_rows ? wte + static_cast<size_t>(row) * C : nullptr;
      const float* p = wpe ? wpe + static_cast<size_t>(t) * C : nullptr;
      if (e && p) {
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
      } else {
        for (int c = 0; c < C; c++) o[c] = e ? e[c] : p ? p[c] : 0.0f;
      }
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tok, int B, int T, int C,
                      int tok_stride, int vocab_begin, int vocab_rows) {
  // Threads split the channels, not the tokens: a repeated token id would otherwise race on its wte row.
  // Every thread still visits rows in the same order, so the sums are deterministic.
  constexpr int kBlock = 16;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    int c1 = c0 + kBlock < C ? c0 + kBlock : C;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
        const int64_t row = static_cast<int64_t>(tok[static_cast<size_t>(b) * tok_stride + t]) - vocab_begin;
        float* p = dwpe + static_cast<size_t>(t) * C;
        if (row < 0 || row >= vocab_rows) {  // another rank's part of the vocabulary
          for (int c = c0; c < c1; c++) p[c] += d[c];
          continue;
        }
        float* e = dwte + static_cast<size_t>(row) * C;
        for (int c = c0; c < c1; c++) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
  }
}

}  // namespace yuan::ops
