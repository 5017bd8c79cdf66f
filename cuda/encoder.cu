// Token + position embedding (CPU twin: src/ops/encoder.cpp). out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
#include <algorithm>

#include "encoder.cuh"

namespace yuan::gpu {
namespace {

// A tensor-parallel rank's wte holds the ids [vocab_begin, vocab_begin + vocab_rows), and only one rank adds the
// positions (wpe null elsewhere): a term a rank does not have is zero, so that the ranks' outputs sum to the
// embedding. The sum is formed in fp32 and rounded once, whichever terms there are.
__global__ void encoder_forward_kernel(bf16* out, const int32_t* tok, const bf16* wte, const bf16* wpe, int B, int T,
                                       int C, int tok_stride, int vocab_begin, int vocab_rows) {
  const int packs = C / PackBf16::kN;
  const size_t total = static_cast<size_t>(B) * T * packs;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / packs;
    const int c = static_cast<int>(i % packs) * PackBf16::kN;
    const int b = static_cast<int>(row / T), t = static_cast<int>(row % T);
    const int id = tok[static_cast<size_t>(b) * tok_stride + t] - vocab_begin;
    float acc[PackBf16::kN] = {};
    if (id >= 0 && id < vocab_rows) {
      const PackBf16 e = load_pack(wte + static_cast<size_t>(id) * C + c);
#pragma unroll
      for (int k = 0; k < PackBf16::kN; k++) acc[k] += __bfloat162float(e.v[k]);
    }
    if (wpe) {
      const PackBf16 p = load_pack(wpe + static_cast<size_t>(t) * C + c);
#pragma unroll
      for (int k = 0; k < PackBf16::kN; k++) acc[k] += __bfloat162float(p.v[k]);
    }
    PackBf16 o;
#pragma unroll
    for (int k = 0; k < PackBf16::kN; k++) o.v[k] = __float2bfloat16(acc[k]);
    store_pack(out + row * C + c, o);
  }
}

// One block per distinct token (first_group + blockIdx.x) and 4-channel slice (thread): the rows of that token are
// summed in their sorted order, so each wte gradient row has one writer and a fixed summation order. dwte's row 0
// is id vocab_begin.
__global__ void wte_backward_kernel(float* dwte, const float* dout, const int32_t* groups, int n_groups,
                                    int first_group, int vocab_begin, int C) {
  const int g = first_group + blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * PackF32::kN;
  if (c >= C) return;
  const int32_t* offsets = groups + 1;
  const int32_t* ids = offsets + n_groups + 1;
  const int32_t* rows = ids + n_groups;
  float acc[PackF32::kN] = {};
  for (int r = offsets[g]; r < offsets[g + 1]; r++) {
    PackF32 d = load_pack(dout + static_cast<size_t>(rows[r]) * C + c);
#pragma unroll
    for (int k = 0; k < PackF32::kN; k++) acc[k] += d.v[k];
  }
  float* dst = dwte + static_cast<size_t>(ids[g] - vocab_begin) * C + c;
  PackF32 w = load_pack(dst);
#pragma unroll
  for (int k = 0; k < PackF32::kN; k++) w.v[k] += acc[k];
  store_pack(dst, w);
}

// One thread per (position, 4 channels), summing over the batch in order.
__global__ void wpe_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int packs = C / PackF32::kN;
  const size_t total = static_cast<size_t>(T) * packs;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / packs), c = static_cast<int>(i % packs) * PackF32::kN;
    float acc[PackF32::kN] = {};
    for (int b = 0; b < B; b++) {
      PackF32 d = load_pack(dout + (static_cast<size_t>(b) * T + t) * C + c);
#pragma unroll
      for (int k = 0; k < PackF32::kN; k++) acc[k] += d.v[k];
    }
    float* dst = dwpe + static_cast<size_t>(t) * C + c;
    PackF32 w = load_pack(dst);
#pragma unroll
    for (int k = 0; k < PackF32::kN; k++) w.v[k] += acc[k];
    store_pack(dst, w);
  }
}

}  // namespace

void encoder_forward(bf16* out, const int32_t* tok, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     int tok_stride, int vocab_begin, int vocab_rows, cudaStream_t s) {
  const int threads = 256;
  launch(encoder_forward_kernel, grid_for(static_cast<size_t>(B) * T * C / PackBf16::kN, threads), threads, 0, s, out,
         tok, wte, wpe, B, T, C, tok_stride, vocab_begin, vocab_rows);
}

size_t token_groups_max_size(int B, int T) {
  const size_t n = static_cast<size_t>(B) * T;
  return 1 + (n + 1) + n + n;  // at most one group per row
}

std::vector<int32_t> token_groups(const int32_t* tok, int B, int T, int tok_stride) {
  const int n = B * T;
  std::vector<int64_t> keyed(static_cast<size_t>(n));  // token << 32 | row: one sort orders by token, then row
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const int row = b * T + t;
      keyed[row] = (static_cast<int64_t>(tok[static_cast<size_t>(b) * tok_stride + t]) << 32) | row;
    }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int32_t> offsets, ids, rows(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) {
    const int32_t id = static_cast<int32_t>(keyed[i] >> 32);
    if (ids.empty() || ids.back() != id) {
      ids.push_back(id);
      offsets.push_back(i);
    }
    rows[i] = static_cast<int32_t>(keyed[i] & 0xffffffff);
  }
  offsets.push_back(n);
  std::vector<int32_t> out;
  out.reserve(1 + offsets.size() + ids.size() + rows.size());
  out.push_back(static_cast<int32_t>(ids.size()));
  out.insert(out.end(), offsets.begin(), offsets.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), rows.begin(), rows.end());
  return out;
}

TokenGroupRange token_group_range(const std::vector<int32_t>& groups, int vocab_begin, int vocab_rows) {
  const int n = groups[0];
  const int32_t* ids = groups.data() + 1 + (n + 1);
  const int32_t* first = std::lower_bound(ids, ids + n, vocab_begin);
  const int32_t* end = std::lower_bound(first, ids + n, static_cast<int64_t>(vocab_begin) + vocab_rows);
  return {static_cast<int>(first - ids), static_cast<int>(end - ids)};
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups, int n_groups,
                      TokenGroupRange held, int vocab_begin, int B, int T, int C, cudaStream_t s) {
  const int threads = 128;
  if (held.end > held.first) {  // a tensor rank may hold none of the batch's ids
    const dim3 grid(held.end - held.first, ceil_div(C / PackF32::kN, threads));
    launch(wte_backward_kernel, grid, threads, 0, s, dwte, dout, groups, n_groups, held.first, vocab_begin, C);
  }
  launch(wpe_backward_kernel, grid_for(static_cast<size_t>(T) * C / PackF32::kN, 256), 256, 0, s, dwpe, dout, B, T, C);
}

}  // namespace yuan::gpu
