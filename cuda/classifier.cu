// Fused softmax + cross-entropy over the vocabulary, gradient written over the bf16 logits (CPU twin:
// src/ops/classifier.cpp).
//   loss = logsumexp(z) - z[y];   dz = scale * (softmax(z) - onehot(y))
// One block per row. The row is read in 16-byte chunks with a running (max, sum of exp) per thread, merged
// across the block; a second pass writes the gradient. Nothing of the row is kept but those two numbers, so no
// fp32 copy of the logits is ever made.
//
// The vocabulary-parallel form (a tensor rank holds the columns of ids [vocab_begin, vocab_begin + V)) is the same
// kernel cut at its block reductions, where the caller all-reduces over the ranks: the row maxima, then the sums
// of exp(z - max) and the target's logit, then the losses and the gradient from those.
#include <cfloat>

#include "classifier.cuh"

namespace yuan::gpu {
namespace {

constexpr int kThreads = 512;

// Which part of the loss a launch computes of each row.
enum class Pass {
  Whole,   // the loss and gradient of a row that holds the whole vocabulary
  Max,     // row_max = max of this rank's logits
  Sums,    // sums = (sum of exp(z - row_max), the target's logit or 0) over this rank's logits
  Finish,  // the loss and gradient from row_max and sums, summed over the ranks
};

// The arguments of every pass, one kernel parameter; a pass reads and writes only its own (the others are null).
struct Rows {
  bf16* logits = nullptr;
  int N = 0, V = 0, ld = 0;  // rows, this rank's columns, row stride
  const int32_t* targets = nullptr;
  int T = 0, tgt_stride = 0, vocab_begin = 0;
  float* losses = nullptr;
  float* row_max = nullptr;  // [N]
  float* sums = nullptr;     // [2, N]: the sums of exp, then the target's logits
  float dscale = 0;
};

// (max, sum) pairs merge as sum_a * e^(max_a - m) + sum_b * e^(max_b - m), m = max(max_a, max_b).
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
  m = mm;
}

template <Pass P>
__global__ void __launch_bounds__(kThreads) classifier_kernel(Rows a) {
  __shared__ float s_max[kThreads / kWarpSize], s_sum[kThreads / kWarpSize];
  __shared__ float s_target_logit;
  const int row = blockIdx.x;
  bf16* z = a.logits + static_cast<size_t>(row) * a.ld;
  const int V = a.V;
  // The target's column here: outside [0, V) when another rank holds it (and in the max pass, which needs none).
  int y = -1;
  if constexpr (P != Pass::Max)
    y = a.targets[static_cast<size_t>(row / a.T) * a.tgt_stride + row % a.T] - a.vocab_begin;
  constexpr int P8 = PackBf16::kN;
  float lse = 0, target = 0;
  if constexpr (P == Pass::Finish) {
    lse = a.row_max[row] + logf(a.sums[row]);
    target = a.sums[a.N + row];
  } else {
    // Start from the lowest finite value, not -inf: a thread with no elements then merges as a zero sum without
    // forming inf - inf. The sums pass measures every chunk from the row's maximum over all ranks instead.
    float m = P == Pass::Sums ? a.row_max[row] : -FLT_MAX, s = 0;
    for (int c = threadIdx.x * P8; c < V; c += kThreads * P8) {
      PackBf16 v = load_pack_cs(z + c);  // reads up to 7 padding columns past V: the row stride ld covers them
      float cm = m;
      if constexpr (P != Pass::Sums) {
        cm = -FLT_MAX;
#pragma unroll
        for (int k = 0; k < P8; k++)
          if (c + k < V) cm = fmaxf(cm, __bfloat162float(v.v[k]));
      }
      float cs = 0;
      if constexpr (P != Pass::Max) {
#pragma unroll
        for (int k = 0; k < P8; k++)
          if (c + k < V) cs += __expf(__bfloat162float(v.v[k]) - cm);
      }
      if constexpr (P == Pass::Sums)
        s += cs;
      else
        merge(m, s, cm, cs);
    }
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
      float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      s_max[warp] = m;
      s_sum[warp] = s;
    }
    if (threadIdx.x == 0) s_target_logit = y >= 0 && y < V ? __bfloat162float(z[y]) : 0.0f;
    __syncthreads();
    m = s_max[0];
    s = s_sum[0];
    for (int w = 1; w < kThreads / kWarpSize; w++) merge(m, s, s_max[w], s_sum[w]);
    if constexpr (P == Pass::Max) {
      if (threadIdx.x == 0) a.row_max[row] = m;
      return;
    } else if constexpr (P == Pass::Sums) {
      if (threadIdx.x == 0) {
        a.sums[row] = s;
        a.sums[a.N + row] = s_target_logit;
      }
      return;
    } else {
      lse = m + logf(s);
      target = s_target_logit;
    }
  }
  if (threadIdx.x == 0) a.losses[row] = lse - target;
  if (a.dscale == 0.0f) return;
  for (int c = threadIdx.x * P8; c < V; c += kThreads * P8) {
    PackBf16 v = load_pack_cs(z + c), d;
#pragma unroll
    for (int k = 0; k < P8; k++) {
      const int i = c + k;
      float g = i < V ? a.dscale * __expf(__bfloat162float(v.v[k]) - lse) - (i == y ? a.dscale : 0.0f) : 0.0f;
      d.v[k] = __float2bfloat16(g);
    }
    store_pack_cs(z + c, d);
  }
}

template <Pass P>
void run(const Rows& a, cudaStream_t s) {
  YUAN_CHECK(a.ld % PackBf16::kN == 0 && a.ld >= a.V,
             "classifier: row stride %d must be >= V = %d and a multiple of %d", a.ld, a.V, PackBf16::kN);
  launch(classifier_kernel<P>, a.N, kThreads, 0, s, a);
}

// The rows of a launch; the pass's other arguments are set by name after.
Rows rows_of(const bf16* logits, int N, int V, int ld) {
  Rows a;
  a.logits = const_cast<bf16*>(logits);  // written only by the passes that write the gradient
  a.N = N, a.V = V, a.ld = ld;
  return a;
}

}  // namespace

void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int B, int T, int V, int ld,
                                 int tgt_stride, float dlogits_scale, cudaStream_t s) {
  Rows a = rows_of(logits, B * T, V, ld);
  a.targets = targets, a.T = T, a.tgt_stride = tgt_stride;
  a.losses = losses, a.dscale = dlogits_scale;
  run<Pass::Whole>(a, s);
}

void classifier_row_max(const bf16* logits, float* row_max, int N, int V, int ld, cudaStream_t s) {
  Rows a = rows_of(logits, N, V, ld);
  a.row_max = row_max;
  run<Pass::Max>(a, s);
}

void classifier_row_sums(const bf16* logits, const float* row_max, const int32_t* targets, int B, int T, int V,
                         int ld, int tgt_stride, int vocab_begin, float* sums, cudaStream_t s) {
  Rows a = rows_of(logits, B * T, V, ld);
  a.targets = targets, a.T = T, a.tgt_stride = tgt_stride, a.vocab_begin = vocab_begin;
  a.row_max = const_cast<float*>(row_max);  // written only by the max pass
  a.sums = sums;
  run<Pass::Sums>(a, s);
}

void classifier_parallel_finish(bf16* logits, float* losses, const float* row_max, const float* sums,
                                const int32_t* targets, int B, int T, int V, int ld, int tgt_stride, int vocab_begin,
                                float dlogits_scale, cudaStream_t s) {
  Rows a = rows_of(logits, B * T, V, ld);
  a.targets = targets, a.T = T, a.tgt_stride = tgt_stride, a.vocab_begin = vocab_begin;
  a.losses = losses, a.dscale = dlogits_scale;
  a.row_max = const_cast<float*>(row_max), a.sums = const_cast<float*>(sums);  // read by this pass
  run<Pass::Finish>(a, s);
}

}  // namespace yuan::gpu
