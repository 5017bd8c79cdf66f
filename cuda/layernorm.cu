// LayerNorm over the channels (CPU twin: src/ops/layernorm.cpp).
//   y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dy * w,  xhat = (x - mean) * rstd
// The forward residual add is fused into the projection GEMM before each LayerNorm instead (cuBLASLt's C
// operand, matmul.cu): that costs no extra pass and rounds the sum to bf16 once. Under tensor parallelism that
// GEMM gives each rank a partial product, and bias and residual can only join after the sum over the ranks:
// bias_residual is that pass. The backward fuses the residual side: it adds dx into the fp32 residual gradient
// and writes the bf16 copy the next GEMM reads, in one pass.
#include "layernorm.cuh"
#include "ops/reference_ops.h"

namespace yuan::gpu {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int kChunks = 128;      // row chunks of the parameter-gradient reduction

// Rows are at most a few thousand channels: three passes over a row that stays in L1 beat holding it in
// registers sized for the largest C.
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                                         const bf16* b, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const bf16* x = inp + static_cast<size_t>(row) * C;
  constexpr int P = PackBf16::kN;
  float sum = 0;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    PackBf16 v = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; k++) sum += __bfloat162float(v.v[k]);
  }
  const float m = warp_sum(sum) / C;
  float var = 0;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    PackBf16 v = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; k++) {
      float d = __bfloat162float(v.v[k]) - m;
      var += d * d;
    }
  }
  const float s = rsqrtf(warp_sum(var) / C + ops::kLayerNormEps);
  bf16* y = out + static_cast<size_t>(row) * C;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    PackBf16 v = load_pack(x + c), wv = load_pack(w + c), bv = load_pack(b + c), o;
#pragma unroll
    for (int k = 0; k < P; k++)
      o.v[k] = __float2bfloat16((__bfloat162float(v.v[k]) - m) * s * __bfloat162float(wv.v[k]) +
                                __bfloat162float(bv.v[k]));
    store_pack(y + c, o);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Input gradient, one warp per row: dres += dx, dres_bf16 = bf16(dres).
__global__ void layernorm_backward_input_kernel(float* dres, bf16* dres_bf16, const bf16* dout, const bf16* inp,
                                                const bf16* w, const float* mean, const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  constexpr int P = PackBf16::kN;
  float dn_mean = 0, dn_xhat_mean = 0;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    PackBf16 dy = load_pack(dout + base + c), x = load_pack(inp + base + c), wv = load_pack(w + c);
#pragma unroll
    for (int k = 0; k < P; k++) {
      float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dy.v[k]);
      dn_mean += dn;
      dn_xhat_mean += dn * (__bfloat162float(x.v[k]) - m) * s;
    }
  }
  dn_mean = warp_sum(dn_mean) / C;
  dn_xhat_mean = warp_sum(dn_xhat_mean) / C;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    PackBf16 dy = load_pack(dout + base + c), x = load_pack(inp + base + c), wv = load_pack(w + c), o;
    PackF32 r[2] = {load_pack(dres + base + c), load_pack(dres + base + c + 4)};
#pragma unroll
    for (int k = 0; k < P; k++) {
      float xhat = (__bfloat162float(x.v[k]) - m) * s;
      float dx = s * (__bfloat162float(wv.v[k]) * __bfloat162float(dy.v[k]) - dn_mean - xhat * dn_xhat_mean);
      float& acc = r[k / 4].v[k % 4];
      acc += dx;
      o.v[k] = __float2bfloat16(acc);
    }
    store_pack(dres + base + c, r[0]);
    store_pack(dres + base + c + 4, r[1]);
    store_pack(dres_bf16 + base + c, o);
  }
}

// Parameter gradients, stage 1: thread = 2 channels, blockIdx.y = a chunk of rows; partial sums of dy * xhat and
// dy per chunk go to `partials` [kChunks][2C]. Stage 2 adds the chunks in order: deterministic, no atomics.
__global__ void layernorm_backward_params_kernel(float* partials, const bf16* dout, const bf16* inp,
                                                 const float* mean, const float* rstd, int N, int C) {
  const int c = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int rows_per_chunk = (N + kChunks - 1) / kChunks;
  const int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
  float dw0 = 0, dw1 = 0, db0 = 0, db1 = 0;
  for (int r = r0; r < r1; r++) {
    const size_t i = static_cast<size_t>(r) * C + c;
    float2 dy = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + i));
    float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(inp + i));
    const float m = mean[r], s = rstd[r];
    dw0 += dy.x * (x.x - m) * s;
    dw1 += dy.y * (x.y - m) * s;
    db0 += dy.x;
    db1 += dy.y;
  }
  float* p = partials + static_cast<size_t>(blockIdx.y) * 2 * C;
  p[c] = dw0;
  p[c + 1] = dw1;
  p[C + c] = db0;
  p[C + c + 1] = db1;
}

__global__ void layernorm_backward_reduce_kernel(float* dw, float* db, const float* partials, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // over 2C: dw then db
  if (i >= 2 * C) return;
  float acc = 0;
  for (int k = 0; k < kChunks; k++) acc += partials[static_cast<size_t>(k) * 2 * C + i];
  if (i < C)
    dw[i] += acc;
  else
    db[i - C] += acc;
}

// out += bias + residual, one thread per 8 channels of a row; the sum in fp32, rounded once.
__global__ void bias_residual_kernel(bf16* out, const bf16* bias, const bf16* residual, int C, size_t packs) {
  const int row_packs = C / PackBf16::kN;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < packs; i += size_t(gridDim.x) * blockDim.x) {
    const size_t at = i * PackBf16::kN;
    PackBf16 o = load_pack(out + at);
    const PackBf16 b = load_pack(bias + static_cast<size_t>(i % row_packs) * PackBf16::kN);
    const PackBf16 r = load_pack(residual + at);
#pragma unroll
    for (int k = 0; k < PackBf16::kN; k++)
      o.v[k] = __float2bfloat16(__bfloat162float(o.v[k]) +
                                (__bfloat162float(b.v[k]) + __bfloat162float(r.v[k])));
    store_pack(out + at, o);
  }
}

}  // namespace

size_t layernorm_partials_size(int C) { return static_cast<size_t>(kChunks) * 2 * C; }

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                       int C, cudaStream_t s) {
  launch(layernorm_forward_kernel, ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize, 0, s, out, mean, rstd, inp, w,
         b, N, C);
}

void layernorm_backward(float* dres, bf16* dres_bf16, float* dw, float* db, float* partials, const bf16* dout,
                        const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t s) {
  launch(layernorm_backward_input_kernel, ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize, 0, s, dres, dres_bf16,
         dout, inp, w, mean, rstd, N, C);
  const int threads = 128;
  launch(layernorm_backward_params_kernel, dim3(ceil_div(C / 2, threads), kChunks), threads, 0, s, partials, dout, inp,
         mean, rstd, N, C);
  launch(layernorm_backward_reduce_kernel, ceil_div(2 * C, 256), 256, 0, s, dw, db, partials, C);
}

void bias_residual(bf16* out, const bf16* bias, const bf16* residual, int N, int C, cudaStream_t s) {
  const size_t packs = static_cast<size_t>(N) * C / PackBf16::kN;
  const int threads = 256;
  launch(bias_residual_kernel, grid_for(packs, threads), threads, 0, s, out, bias, residual, C, packs);
}

}  // namespace yuan::gpu
