// Fused softmax + cross-entropy (classifier.cu; CPU twin src/ops/classifier.cpp) over bf16 logits[N, V] (row
// stride ld): losses[i] = logsumexp - logit of target. With dlogits_scale != 0 the logits are overwritten by
// dlogits_scale * (softmax - onehot), as on the CPU. Columns [V, ld) are padding, ignored by the loss whatever they
// hold. The gradient is written in whole 8-value vectors, so the padding up to V rounded up to 8 becomes zero and
// the rest of it is left as it was.
#pragma once
#include <cstdint>

#include "common.cuh"

namespace yuan::gpu {

void classifier_forward_backward(bf16* logits, float* losses, const int32_t* targets, int B, int T, int V, int ld,
                                 int tgt_stride, float dlogits_scale, cudaStream_t s);
// The vocabulary-parallel cross-entropy (CPU twins classifier_row_max, classifier_row_sums,
// classifier_parallel_finish): this rank's logits are the V columns of ids [vocab_begin, vocab_begin + V), and the
// caller all-reduces row_max [N] (MAX) after the first pass and sums [2, N] (SUM) after the second. The finish
// leaves the losses and, with dlogits_scale != 0, the gradient (padding as above) as classifier_forward_backward
// does over the whole row.
void classifier_row_max(const bf16* logits, float* row_max, int N, int V, int ld, cudaStream_t s);
void classifier_row_sums(const bf16* logits, const float* row_max, const int32_t* targets, int B, int T, int V,
                         int ld, int tgt_stride, int vocab_begin, float* sums, cudaStream_t s);
void classifier_parallel_finish(bf16* logits, float* losses, const float* row_max, const float* sums,
                                const int32_t* targets, int B, int T, int V, int ld, int tgt_stride, int vocab_begin,
                                float dlogits_scale, cudaStream_t s);

}  // namespace yuan::gpu
