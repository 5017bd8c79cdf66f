// The op vocabulary of backend/ops_interface.h on one GPU (cuda_ops.cu), and the sizes behind the CUDA backend's
// TensorFormats (cuda_backend.cu assembles them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/ops_interface.h"
#include "common.cuh"

namespace yuan::gpu {

// F32 elements of one value per (row, head): the attention's saved logsumexp, and its backward's delta.
size_t attention_rows(int B, int T, int NH);
// Row stride of the logits: V rounded up to 64.
int64_t logits_stride(int V);
// I32 elements of a token buffer: B rows of T+1 ids, then the embedding backward's grouping of them.
size_t token_slot(int B, int T);
// Device bytes of the scratch a CudaOps of width C allocates for itself.
size_t ops_scratch_bytes(int C);

// F32 elements of the attention's scratch: attention.cu's backward keeps delta per (row, head); cuDNN's graphs
// take their workspace from it.
size_t attention_scratch(int B, int T, int NH, int head_size, AttentionPath path);
// Ops on tensors of width `n_embd`, their attention on `attention`'s kernels, enqueued on `compute`.
std::unique_ptr<Ops> make_cuda_ops(int n_embd, AttentionPath attention, cudaStream_t compute);

}  // namespace yuan::gpu
