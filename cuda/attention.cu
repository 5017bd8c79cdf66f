// Causal multi-head self-attention, flash-attention style (CPU twin: src/ops/attention.cpp, which states the math).
//   forward:  per query block, stream the key blocks through shared memory; S = Q K^T * scale on the tensor cores
//             (mma.sync m16n8k16, bf16 in, fp32 accumulate), online softmax (running max m and sum l per row,
//             rescaling O), O += P V. Saves only lse = m + log(l) per row: the [T,T] matrix is never stored.
//   backward: P is recomputed from lse. delta = rowsum(dO * O); dS = P * (dP - delta), dP = dO V^T.
//             kernel kv: per key block, loop over the query blocks at or after it: dV += P^T dO, dK += dS^T Q.
//             kernel q:  per query block, loop over the key blocks up to it:      dQ += dS K.
//             Two kernels recompute S and dP twice, which costs two extra small GEMMs per tile, but every gradient
//             has one writer: no atomics, no fp32 dQ scratch, and the same bits every run.
// Each warp owns 16 rows of the tile; a thread holds, per 16x8 accumulator tile, rows lane/4 and lane/4 + 8 and
// columns 2*(lane%4) + {0,1} (the mma layout), and an accumulator converts to the next mma's A operand in
// registers, so P and dS never go through shared memory.
//
// Per-shape choice: the head size is padded to the next of 16, 32, 64, 128 (zeros in shared memory, which add
// nothing to any dot product), one instantiation each; the backward's query step is 64 rows, 32 at head size 128
// to keep dK and dV accumulators (128 fp32 registers per thread) from spilling.
//
// cuDNN's fused SDPA engines run the same op through cudnn_attention.cpp (model.attention chooses); these kernels are
// the path where cuDNN is missing or refuses the shape, and the one `own` asks for.
#include <cmath>

#include "attention.cuh"
#include "ptx.cuh"

namespace yuan::gpu {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * kWarpSize;
constexpr int kTile = 64;  // queries per block (forward, dQ), keys per block (dK dV), keys per step (forward, dQ)
constexpr float kLog2e = 1.4426950408889634f;

// Shared-memory row stride in elements: 16 bytes of padding put the 8 rows of an ldmatrix in 8 different bank
// groups.
template <int D>
constexpr int kStride = D + 8;
template <int D>
constexpr int kBackwardQStep = D <= 64 ? 64 : 32;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// Rows [row0, row0 + ROWS) of one head's slice (base points at row 0 of it, rows `ld` apart) into a shared tile
// [ROWS][D + 8]; zeros past T and past the head size.
template <int D, int ROWS>
__device__ void load_tile(bf16* tile, const bf16* base, int row0, int T, size_t ld, int hs) {
  constexpr int kPacks = D / PackBf16::kN;
  for (int i = threadIdx.x; i < ROWS * kPacks; i += kThreads) {
    const int r = i / kPacks, c = (i % kPacks) * PackBf16::kN;
    // A pack, which the emulator sees as the one 16-byte access it is (an int4 copy reached it as four), of 4 ints:
    // the zero fill and the select stay on 32-bit registers (8 bf16 cost ptxas up to 24 more registers a thread).
    Pack<int> v{};
    if (row0 + r < T && c < hs)
      v = load_pack(reinterpret_cast<const int*>(base + static_cast<size_t>(row0 + r) * ld + c));
    store_pack(reinterpret_cast<int*>(tile + r * kStride<D> + c), v);
  }
}

// acc (16 x 8*NT) += tile_a[r0 .. r0+16) (16 x D) @ tile_b[n0 .. n0 + 8*NT)^T: both tiles stored [row][D], the
// product contracts over D (S = Q K^T, S^T = K Q^T, dP = dO V^T, dP^T = V dO^T).
template <int D, int NT>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const bf16* tile_a, int r0, const bf16* tile_b,
                                         int n0) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t a[4];
    ldmatrix_x4(a, tile_a + (r0 + lane % 16) * kStride<D> + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int j = 0; j < NT / 2; j++) {
      uint32_t b[4];
      ldmatrix_x4(b, tile_b + (n0 + j * 16 + (lane / 16) * 8 + lane % 8) * kStride<D> + kk * 16 + ((lane / 8) % 2) * 8);
      mma_m16n8k16_bf16(acc[2 * j], a, b[0], b[1]);
      mma_m16n8k16_bf16(acc[2 * j + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x D) += P (16 x 8*NT, this warp's accumulator tiles, rounded to bf16) @ tile_b[0 .. 8*NT) (stored
// [row][D]): the product contracts over the tile's rows (O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K).
template <int D, int NT>
__device__ __forceinline__ void mma_acc(float (&acc)[D / 8][4], const float (&p)[NT][4], const bf16* tile_b) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int j = 0; j < NT / 2; j++) {
    const uint32_t a[4] = {pack_bf16(p[2 * j][0], p[2 * j][1]), pack_bf16(p[2 * j][2], p[2 * j][3]),
                           pack_bf16(p[2 * j + 1][0], p[2 * j + 1][1]), pack_bf16(p[2 * j + 1][2], p[2 * j + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, tile_b + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride<D> + dp * 16 + (lane / 16) * 8);
      mma_m16n8k16_bf16(acc[2 * dp], a, b[0], b[1]);
      mma_m16n8k16_bf16(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Rows r_a and r_a + 8 of a 16 x D accumulator, times `scale`, into rows of `dst` (row stride ld) below T.
template <int D>
__device__ __forceinline__ void store_rows(bf16* dst, size_t ld, const float (&acc)[D / 8][4], int r_a, int T,
                                           int hs, float scale_a, float scale_b) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    const int col = dt * 8 + (lane % 4) * 2;
    if (col >= hs) continue;
    if (r_a < T)
      *reinterpret_cast<__nv_bfloat162*>(dst + static_cast<size_t>(r_a) * ld + col) =
          __floats2bfloat162_rn(acc[dt][0] * scale_a, acc[dt][1] * scale_a);
    if (r_a + 8 < T)
      *reinterpret_cast<__nv_bfloat162*>(dst + static_cast<size_t>(r_a + 8) * ld + col) =
          __floats2bfloat162_rn(acc[dt][2] * scale_b, acc[dt][3] * scale_b);
  }
}

// grid (query blocks, B*NH). Heaviest (last) query blocks are scheduled first.
template <int D>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                     int C, int NH, float scale_log2) {
  bf16* Qs = dynamic_smem<bf16>();
  bf16* Ks = Qs + kTile * kStride<D>;
  bf16* Vs = Ks + kTile * kStride<D>;
  const int hs = C / NH, qb = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* base = qkv + static_cast<size_t>(b) * T * ld + h * hs;
  const int q0 = qb * kTile, row_a = q0 + warp * 16 + lane / 4;  // this thread's rows: row_a, row_a + 8
  load_tile<D, kTile>(Qs, base, q0, T, ld, hs);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  for (int kb = 0; kb <= qb; kb++) {
    __syncthreads();  // the previous K, V tiles are consumed
    load_tile<D, kTile>(Ks, base + C, kb * kTile, T, ld, hs);
    load_tile<D, kTile>(Vs, base + 2 * C, kb * kTile, T, ld, hs);
    __syncthreads();
    float s[kTile / 8][4] = {};
    mma_rows<D, kTile / 8>(s, Qs, warp * 16, Ks, 0);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = kb * kTile + nt * 8 + (lane % 4) * 2 + (c & 1), row = row_a + (c / 2) * 8;
        const float v = (kb == qb && key > row) ? -INFINITY : s[nt][c] * scale_log2;
        s[nt][c] = v;
        mx[c / 2] = fmaxf(mx[c / 2], v);
      }
    // Key 0 is in the first block and visible to every row, so mx is finite from the first block on.
    float corr[2], sum[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 2; i++) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      corr[i] = exp2f(m[i] - mx[i]);
      m[i] = mx[i];
    }
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        s[nt][c] = exp2f(s[nt][c] - m[c / 2]);
        sum[c / 2] += s[nt][c];
      }
#pragma unroll
    for (int i = 0; i < 2; i++) l[i] = l[i] * corr[i] + sum[i];  // this thread's share; lanes are summed at the end
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
      for (int c = 0; c < 4; c++) o[dt][c] *= corr[c / 2];
    mma_acc<D, kTile / 8>(o, s, Vs);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  store_rows<D>(out + static_cast<size_t>(b) * T * C + h * hs, C, o, row_a, T, hs, 1.0f / l[0], 1.0f / l[1]);
  if (lane % 4 == 0)
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int row = row_a + i * 8;
      if (row < T) lse[static_cast<size_t>(blockIdx.y) * T + row] = (m[i] + log2f(l[i])) / kLog2e;
    }
}

// delta[b,h,t] = sum over the head's channels of dout * out.
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t total = static_cast<size_t>(B) * T * NH;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / NH;
    const int h = static_cast<int>(i % NH);
    const size_t off = bt * C + h * hs;
    float acc = 0;
    for (int c = 0; c < hs; c += PackBf16::kN) {
      PackBf16 d = load_pack(dout + off + c), o = load_pack(out + off + c);
#pragma unroll
      for (int k = 0; k < PackBf16::kN; k++) acc += __bfloat162float(d.v[k]) * __bfloat162float(o.v[k]);
    }
    const size_t b = bt / T, t = bt % T;
    delta[(b * NH + h) * T + t] = acc;
  }
}

// grid (key blocks, B*NH): dK, dV of one key block. Low key blocks see the most queries and go first.
template <int D>
__global__ void __launch_bounds__(kThreads) attention_backward_kv_kernel(bf16* dqkv, const bf16* qkv, const bf16* dout,
                                                                         const float* lse, const float* delta, int T,
                                                                         int C, int NH, float scale, float scale_log2) {
  constexpr int BQ = kBackwardQStep<D>;
  bf16* Ks = dynamic_smem<bf16>();
  bf16* Vs = Ks + kTile * kStride<D>;
  bf16* Qs = Vs + kTile * kStride<D>;
  bf16* dOs = Qs + BQ * kStride<D>;
  float* lse_s = reinterpret_cast<float*>(dOs + BQ * kStride<D>);  // in log2 units
  float* delta_s = lse_s + BQ;
  const int hs = C / NH, b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* base = qkv + static_cast<size_t>(b) * T * ld + h * hs;
  const bf16* dbase = dout + static_cast<size_t>(b) * T * C + h * hs;
  const float* lse_bh = lse + static_cast<size_t>(blockIdx.y) * T;
  const float* delta_bh = delta + static_cast<size_t>(blockIdx.y) * T;
  const int k0 = blockIdx.x * kTile, key_a = k0 + warp * 16 + lane / 4;  // this thread's keys: key_a, key_a + 8
  load_tile<D, kTile>(Ks, base + C, k0, T, ld, hs);
  load_tile<D, kTile>(Vs, base + 2 * C, k0, T, ld, hs);

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int q0 = k0; q0 < T; q0 += BQ) {
    __syncthreads();  // the previous Q, dO tiles are consumed
    load_tile<D, BQ>(Qs, base, q0, T, ld, hs);
    load_tile<D, BQ>(dOs, dbase, q0, T, C, hs);
    for (int i = threadIdx.x; i < BQ; i += kThreads) {
      const bool in = q0 + i < T;
      lse_s[i] = in ? lse_bh[q0 + i] * kLog2e : 0.0f;
      delta_s[i] = in ? delta_bh[q0 + i] : 0.0f;
    }
    __syncthreads();
    float s[BQ / 8][4] = {}, dp[BQ / 8][4] = {};
    mma_rows<D, BQ / 8>(s, Ks, warp * 16, Qs, 0);    // S^T: keys x queries
    mma_rows<D, BQ / 8>(dp, Vs, warp * 16, dOs, 0);  // dP^T
#pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int ql = nt * 8 + (lane % 4) * 2 + (c & 1), q = q0 + ql, key = key_a + (c / 2) * 8;
        const float p = (q >= key && q < T) ? exp2f(s[nt][c] * scale_log2 - lse_s[ql]) : 0.0f;
        s[nt][c] = p;
        dp[nt][c] = p * (dp[nt][c] - delta_s[ql]);  // dS^T
      }
    mma_acc<D, BQ / 8>(dv, s, dOs);
    mma_acc<D, BQ / 8>(dk, dp, Qs);
  }
  bf16* dst = dqkv + static_cast<size_t>(b) * T * ld + h * hs;
  store_rows<D>(dst + C, ld, dk, key_a, T, hs, scale, scale);
  store_rows<D>(dst + 2 * C, ld, dv, key_a, T, hs, 1.0f, 1.0f);
}

// grid (query blocks, B*NH): dQ of one query block. Heaviest (last) query blocks first.
template <int D>
__global__ void __launch_bounds__(kThreads) attention_backward_q_kernel(bf16* dqkv, const bf16* qkv, const bf16* dout,
                                                                        const float* lse, const float* delta, int T,
                                                                        int C, int NH, float scale, float scale_log2) {
  bf16* Qs = dynamic_smem<bf16>();
  bf16* dOs = Qs + kTile * kStride<D>;
  bf16* Ks = dOs + kTile * kStride<D>;
  bf16* Vs = Ks + kTile * kStride<D>;
  const int hs = C / NH, qb = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* base = qkv + static_cast<size_t>(b) * T * ld + h * hs;
  const int q0 = qb * kTile, row_a = q0 + warp * 16 + lane / 4;
  load_tile<D, kTile>(Qs, base, q0, T, ld, hs);
  load_tile<D, kTile>(dOs, dout + static_cast<size_t>(b) * T * C + h * hs, q0, T, C, hs);
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = row_a + i * 8;
    const size_t at = static_cast<size_t>(blockIdx.y) * T + row;
    row_lse[i] = row < T ? lse[at] * kLog2e : 0.0f;
    row_delta[i] = row < T ? delta[at] : 0.0f;
  }

  float dq[D / 8][4] = {};
  for (int kb = 0; kb <= qb; kb++) {
    __syncthreads();
    load_tile<D, kTile>(Ks, base + C, kb * kTile, T, ld, hs);
    load_tile<D, kTile>(Vs, base + 2 * C, kb * kTile, T, ld, hs);
    __syncthreads();
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    mma_rows<D, kTile / 8>(s, Qs, warp * 16, Ks, 0);
    mma_rows<D, kTile / 8>(dp, dOs, warp * 16, Vs, 0);
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = kb * kTile + nt * 8 + (lane % 4) * 2 + (c & 1), i = c / 2, row = row_a + i * 8;
        const float p = key <= row ? exp2f(s[nt][c] * scale_log2 - row_lse[i]) : 0.0f;
        s[nt][c] = p * (dp[nt][c] - row_delta[i]);  // dS
      }
    mma_acc<D, kTile / 8>(dq, s, Ks);
  }
  store_rows<D>(dqkv + static_cast<size_t>(b) * T * ld + h * hs, ld, dq, row_a, T, hs, scale, scale);
}

template <int D>
size_t forward_smem() {
  return 3 * kTile * kStride<D> * sizeof(bf16);
}
template <int D>
size_t backward_kv_smem() {
  return (2 * kTile + 2 * kBackwardQStep<D>) * kStride<D> * sizeof(bf16) + 2 * kBackwardQStep<D> * sizeof(float);
}
template <int D>
size_t backward_q_smem() {
  return 4 * kTile * kStride<D> * sizeof(bf16);
}

// The kernels' grid, (tiles along T, B*NH). CUDA caps grid.y at 65535, and a launch past that fails with an
// error that does not say why.
dim3 tile_grid(int B, int T, int NH) {
  const long long heads = static_cast<long long>(B) * NH;
  YUAN_CHECK(heads <= 65535, "attention: micro-batch %d x n_head %d = %lld exceeds CUDA's grid.y limit of 65535", B,
             NH, heads);
  return dim3(ceil_div(T, kTile), static_cast<unsigned>(heads));
}

template <int D>
void forward_impl(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  static const bool init = (allow_smem(attention_forward_kernel<D>, forward_smem<D>()), true);
  (void)init;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  launch(attention_forward_kernel<D>, tile_grid(B, T, NH), kThreads, forward_smem<D>(), s, out, lse, qkv, T, C, NH,
         scale * kLog2e);
}

template <int D>
void backward_impl(bf16* dqkv, const float* delta, const bf16* dout, const bf16* qkv, const float* lse, int B, int T,
                   int C, int NH, cudaStream_t s) {
  static const bool init = (allow_smem(attention_backward_kv_kernel<D>, backward_kv_smem<D>()),
                            allow_smem(attention_backward_q_kernel<D>, backward_q_smem<D>()), true);
  (void)init;
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  const dim3 grid = tile_grid(B, T, NH);
  launch(attention_backward_kv_kernel<D>, grid, kThreads, backward_kv_smem<D>(), s, dqkv, qkv, dout, lse, delta, T, C,
         NH, scale, scale * kLog2e);
  launch(attention_backward_q_kernel<D>, grid, kThreads, backward_q_smem<D>(), s, dqkv, qkv, dout, lse, delta, T, C, NH,
         scale, scale * kLog2e);
}

int padded_head_size(int C, int NH) {
  const int hs = C / NH;
  YUAN_CHECK(C % NH == 0 && hs % 8 == 0 && hs <= 128,
             "attention: head size %d (n_embd %d / n_head %d) must be a multiple of 8 and at most 128", hs, C, NH);
  return hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : 128;
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  switch (padded_head_size(C, NH)) {
    case 16: return forward_impl<16>(out, lse, qkv, B, T, C, NH, s);
    case 32: return forward_impl<32>(out, lse, qkv, B, T, C, NH, s);
    case 64: return forward_impl<64>(out, lse, qkv, B, T, C, NH, s);
    default: return forward_impl<128>(out, lse, qkv, B, T, C, NH, s);
  }
}

void attention_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int C, int NH, cudaStream_t s) {
  launch(attention_delta_kernel, grid_for(static_cast<size_t>(B) * T * NH, 256), 256, 0, s, delta, dout, out, B, T, C,
         NH);
}

void attention_backward(bf16* dqkv, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t s) {
  const int D = padded_head_size(C, NH);
  attention_delta(delta, dout, out, B, T, C, NH, s);
  switch (D) {
    case 16: return backward_impl<16>(dqkv, delta, dout, qkv, lse, B, T, C, NH, s);
    case 32: return backward_impl<32>(dqkv, delta, dout, qkv, lse, B, T, C, NH, s);
    case 64: return backward_impl<64>(dqkv, delta, dout, qkv, lse, B, T, C, NH, s);
    default: return backward_impl<128>(dqkv, delta, dout, qkv, lse, B, T, C, NH, s);
  }
}

}  // namespace yuan::gpu
