// LayerNorm over the channels (CPU twin: src/ops/layernorm.cpp).
//   y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps)
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dy * w,  xhat = (x - mean) * rstd
// The forward residual add is fused into the projection GEMM before each LayerNorm instead (cuBLASLt's C
// operand, matmul.cu): that costs no extra pass and rounds the sum to bf16 once. Under tensor parallelism that
// GEMM gives each rank a partial product, and bias and residual can only join after the sum over the ranks:
// bias_residual is that pass. The backward fuses the residual side: it adds dx into the fp32 residual gradient
// and writes the bf16 copy the next GEMM reads, in one pass.
#include "layernorm.cuh"

#include <algorithm>

#include "ops/reference_ops.h"

namespace yuan::gpu {
namespace {

constexpr int kRowsPerBlock = 8;  // forward: one warp per row
// The backward's blocks: at most kBackwardBlocks (2 per SM of an H100, with room), each over at least
// kBackwardRows rows, so that the partials' round trip (8C bytes written and read per block) stays within a few
// percent of the op's 14 bytes per element; warps per block as many as fit kBackwardShared bytes of slices. The cap
// binds above 264 x 32 = 8448 rows (a fixed number, not the device's SMs), where blocks take more than 32 rows.
constexpr int kBackwardBlocks = 264, kBackwardRows = 32, kBackwardWarps = 8;
constexpr size_t kBackwardShared = 100 << 10;

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

// The backward, one warp per row, each block over a contiguous chunk of rows: dres += dx, dres_bf16 = bf16(dres),
// and the block's sums of dy * xhat (dw) and dy (db) per channel into partials[block] = [dw | db]; the reduce
// kernel adds the blocks' partials in block order. One pass over dy and x serves both gradients (a separate
// parameter-gradient pass would read them again: 4 of the 14 bytes per element the op must move).
// A lane takes 4 channels at a time, so that its bf16 reads (8 bytes) and fp32 reads and writes (16 bytes) are
// each one contiguous request of the warp. Each warp sums its rows into its own slice of shared memory, so no two
// threads add into one float and every sum has a fixed order: deterministic, without atomics.
__global__ void layernorm_backward_kernel(float* partials, float* dres, bf16* dres_bf16, const bf16* dout,
                                          const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N,
                                          int C, int rows_per_block) {
  float* slices = dynamic_smem<float>();  // [warps][dw C | db C]
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
  float* dw_acc = slices + static_cast<size_t>(warp) * 2 * C;
  float* db_acc = dw_acc + C;
  constexpr int P = HalfPackBf16::kN;
  const PackF32 zero = {};
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    store_pack(dw_acc + c, zero);
    store_pack(db_acc + c, zero);
  }
  const int r0 = blockIdx.x * rows_per_block, r1 = min(N, r0 + rows_per_block);
  for (int row = r0 + warp; row < r1; row += warps) {
    const size_t base = static_cast<size_t>(row) * C;
    const float m = mean[row], s = rstd[row];
    float dn_mean = 0, dn_xhat_mean = 0;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      const HalfPackBf16 dy = load_pack<8>(dout + base + c), x = load_pack<8>(inp + base + c), wv = load_pack<8>(w + c);
#pragma unroll
      for (int k = 0; k < P; k++) {
        float dn = __bfloat162float(wv.v[k]) * __bfloat162float(dy.v[k]);
        dn_mean += dn;
        dn_xhat_mean += dn * (__bfloat162float(x.v[k]) - m) * s;
      }
    }
    dn_mean = warp_sum(dn_mean) / C;
    dn_xhat_mean = warp_sum(dn_xhat_mean) / C;
    // The row's second reading of dy and x is the same warp's, right after the first: it hits L1.
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      const HalfPackBf16 dy = load_pack<8>(dout + base + c), x = load_pack<8>(inp + base + c), wv = load_pack<8>(w + c);
      PackF32 r = load_pack(dres + base + c), gw = load_pack(dw_acc + c), gb = load_pack(db_acc + c);
      HalfPackBf16 o;
#pragma unroll
      for (int k = 0; k < P; k++) {
        const float xhat = (__bfloat162float(x.v[k]) - m) * s, g = __bfloat162float(dy.v[k]);
        const float dx = s * (__bfloat162float(wv.v[k]) * g - dn_mean - xhat * dn_xhat_mean);
        r.v[k] += dx;
        o.v[k] = __float2bfloat16(r.v[k]);
        gw.v[k] += g * xhat;
        gb.v[k] += g;
      }
      store_pack(dres + base + c, r);
      store_pack(dres_bf16 + base + c, o);
      store_pack(dw_acc + c, gw);
      store_pack(db_acc + c, gb);
    }
  }
  __syncthreads();
  float* out = partials + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {  // dw of channel i, then db of channel i - C
    float sum = 0;
    for (int k = 0; k < warps; k++) sum += slices[static_cast<size_t>(k) * 2 * C + i];
    out[i] = sum;
  }
}

__global__ void layernorm_backward_reduce_kernel(float* dw, float* db, const float* partials, int C, int blocks) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // over 2C: dw then db
  if (i >= 2 * C) return;
  float acc = 0;
  for (int k = 0; k < blocks; k++) acc += partials[static_cast<size_t>(k) * 2 * C + i];
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

size_t layernorm_partials_size(int C) { return static_cast<size_t>(kBackwardBlocks) * 2 * C; }

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N,
                       int C, cudaStream_t s) {
  launch(layernorm_forward_kernel, ceil_div(N, kRowsPerBlock), kRowsPerBlock * kWarpSize, 0, s, out, mean, rstd, inp, w,
         b, N, C);
}

void layernorm_backward(float* dres, bf16* dres_bf16, float* dw, float* db, float* partials, const bf16* dout,
                        const bf16* inp, const bf16* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t s) {
  const size_t slice = 2 * static_cast<size_t>(C) * sizeof(float);
  YUAN_CHECK(slice <= kBackwardShared, "layernorm_backward: width %d above the %zu channels a warp's slice can hold", C,
             kBackwardShared / (2 * sizeof(float)));
  const int warps = static_cast<int>(std::min<size_t>(kBackwardWarps, kBackwardShared / slice));
  const int blocks = std::max(1, std::min(kBackwardBlocks, static_cast<int>(ceil_div(N, kBackwardRows))));
  const int rows_per_block = static_cast<int>(ceil_div(N, blocks));
  const size_t shared = warps * slice;
  static const bool init = (allow_smem(layernorm_backward_kernel, kBackwardShared), true);
  (void)init;
  launch(layernorm_backward_kernel, blocks, warps * kWarpSize, shared, s, partials, dres, dres_bf16, dout, inp, w,
         mean, rstd, N, C, rows_per_block);
  launch(layernorm_backward_reduce_kernel, ceil_div(2 * C, 256), 256, 0, s, dw, db, partials, C, blocks);
}

void bias_residual(bf16* out, const bf16* bias, const bf16* residual, int N, int C, cudaStream_t s) {
  const size_t packs = static_cast<size_t>(N) * C / PackBf16::kN;
  const int threads = 256;
  launch(bias_residual_kernel, grid_for(packs, threads), threads, 0, s, out, bias, residual, C, packs);
}

}  // namespace yuan::gpu
