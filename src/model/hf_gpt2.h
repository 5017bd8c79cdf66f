// HuggingFace's GPT-2 (transformers' modeling_gpt2.py, GPT2LMHeadModel) as this model's weights, both ways: what
// `yuanlm export` writes and what `init.from` reads. The architectures are the same (learned positions,
// pre-LayerNorm, GELU tanh = "gelu_new", LayerNorm eps 1e-5, tied classifier), so the mapping is renaming plus one
// transpose: HF keeps its block matrices in Conv1D layout [in, out] (y = x @ W + b), this model nn.Linear's
// [out, in]. The embeddings are [rows, n_embd] in both.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace yuan {

class SafetensorsReader;

// The name of tensor `t` in a GPT2LMHeadModel's state dict ("transformer." + its name here).
std::string hf_gpt2_name(const TensorSpec& t);
// Whether HF keeps `t` transposed: the blocks' matrices (Conv1D), not the embeddings.
bool hf_gpt2_transposed(const TensorSpec& t);
// The `rows` x `cols` row-major matrix at `src` as its `cols` x `rows` transpose at `dst`: HF's Conv1D [in, out]
// from this model's [out, in], and back.
void hf_gpt2_transpose(const float* src, int64_t rows, int64_t cols, float* dst);
// config.json of a GPT2LMHeadModel of shape `c` (its vocabulary `c.vocab_size`); `eot_id` >= 0 is written as the
// bos and eos token.
std::string hf_gpt2_config(const GPTConfig& c, int eot_id);

// A HuggingFace GPT-2 directory (config.json, model.safetensors) read as the initial weights of a model of shape
// `deck`. The constructor checks config.json against the deck and refuses, naming the file and the first key that
// differs: another architecture, n_layer, n_head or n_embd, an MLP other than 4 n_embd, another activation or
// LayerNorm epsilon, untied embeddings, fewer positions than model.seq_len (more are cut to seq_len), or more
// tokens than model.vocab_size (fewer leave the deck's extra rows of wte zero: its padding). Tensor names with and
// without the "transformer." prefix (save_pretrained's, the hub's original GPT-2 files) are read; the attention's
// mask buffers are ignored. F32, F16 and BF16 tensors are read as fp32.
class HfGpt2Weights {
 public:
  HfGpt2Weights(const std::string& dir, const GPTConfig& deck);
  ~HfGpt2Weights();
  HfGpt2Weights(const HfGpt2Weights&) = delete;
  HfGpt2Weights& operator=(const HfGpt2Weights&) = delete;

  // The whole model's values (ParamLayout(deck), no tensor parallelism) at [global, global + count). Each tensor
  // is converted once and kept until a read reaches another: reads in increasing order cost one pass.
  void read(size_t global, size_t count, float* dst) const;

 private:
  void convert(const TensorSpec& t) const;  // into whole_
  ParamLayout layout_;
  std::unique_ptr<SafetensorsReader> file_;
  std::string prefix_;  // "transformer." or ""
  int hf_vocab_ = 0, hf_positions_ = 0;
  mutable int converted_ = -1;  // the tensor id in whole_
  mutable std::vector<float> whole_;
};

}  // namespace yuan
