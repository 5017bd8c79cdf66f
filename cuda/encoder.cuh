// Token + position embedding (encoder.cu; CPU twin src/ops/encoder.cpp): out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.cuh"

namespace yuan::gpu {

// wte holds the ids [vocab_begin, vocab_begin + vocab_rows): the whole vocabulary, or a tensor-parallel rank's part
// of it, where other ids contribute zero. wpe may be null: only one tensor rank adds the positions.
void encoder_forward(bf16* out, const int32_t* tok, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     int tok_stride, int vocab_begin, int vocab_rows, cudaStream_t s);
// The embedding backward sums dout rows per token id without atomics, so gradients are the same bits every run.
// The grouping is built on the host, where the tokens are: token_groups() returns
//   [n_groups | n_groups+1 offsets into rows | n_groups token ids, ascending | B*T rows (b*T + t) sorted by token]
// (at most token_groups_max_size(B, T) values) and encoder_backward reads that array in device memory.
std::vector<int32_t> token_groups(const int32_t* tok, int B, int T, int tok_stride);
size_t token_groups_max_size(int B, int T);
// The groups [first, end) of a grouping whose ids are in [vocab_begin, vocab_begin + vocab_rows): as the ids
// ascend, a tensor-parallel rank's part of the vocabulary is one run of groups, and its backward visits only those.
struct TokenGroupRange {
  int first = 0, end = 0;
};
TokenGroupRange token_group_range(const std::vector<int32_t>& groups, int vocab_begin, int vocab_rows);
// dwte (rows from id vocab_begin) += the dout rows of the `held` groups; dwpe += every dout row.
// Why the backward reads dout twice (the kernel account's "exempt"): each gradient row has one writer that sums its
// dout rows in a fixed order, without atomics, and the two gradients order the rows differently: dwte's by token
// (the groups), dwpe's by position.
constexpr const char* kEncoderBackwardExempt =
    "dout read twice: dwte sums its rows by token, dwpe by position, each row one writer in a fixed order";
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* groups, int n_groups,
                      TokenGroupRange held, int vocab_begin, int B, int T, int C, cudaStream_t s);

}  // namespace yuan::gpu
