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

}  // namespace yuan::gpu
