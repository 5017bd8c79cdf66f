// GPT-2 model description: shape, the parameter table, initialisation and cost.
//
// All parameters live in ONE flat fp32 buffer. The table below orders them by module
//   wte, wpe, h.0 ... h.{L-1}, ln_f
// and each module is a contiguous range, so optimizer sharding, gradient buckets, checkpoints, export and
// pipeline stages all work on [offset, offset+numel) ranges. Tensor names follow HuggingFace GPT-2 without the
// "transformer." prefix. Matrices are stored [out, in] (nn.Linear layout); export transposes to Conv1D.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace yuan {

struct GPTConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int seq_len = 0;     // maximum context = rows of wpe
  int vocab_size = 0;  // rows of wte (tied with the output classifier)
};

struct TensorSpec {
  std::string name;            // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // row-major
  size_t offset = 0;           // into the flat buffer, in elements
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies to matrices and embeddings (dim >= 2), not biases/LN
  int module = 0;      // index into ParamLayout::modules
};

struct ModuleSpec {
  std::string name;  // "wte", "wpe", "h.0", ..., "ln_f"
  size_t offset = 0;
  size_t numel = 0;
  int first_tensor = 0;
  int n_tensors = 0;
};

// Offsets of the 12 tensors inside one transformer block, in table order.
enum BlockTensor {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kBlockTensors
};

class ParamLayout {
 public:
  explicit ParamLayout(const GPTConfig& c);
  const GPTConfig& config() const { return cfg_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<ModuleSpec>& modules() const { return modules_; }
  size_t total() const { return total_; }
  const TensorSpec& find(const std::string& name) const;  // throws Error naming the tensor
  const TensorSpec& wte() const { return tensors_[0]; }
  const TensorSpec& wpe() const { return tensors_[1]; }
  const TensorSpec& block(int layer, BlockTensor t) const { return tensors_[2 + layer * kBlockTensors + t]; }
  const TensorSpec& ln_f_w() const { return tensors_[tensors_.size() - 2]; }
  const TensorSpec& ln_f_b() const { return tensors_.back(); }

 private:
  GPTConfig cfg_;
  std::vector<TensorSpec> tensors_;
  std::vector<ModuleSpec> modules_;
  size_t total_ = 0;
};

// GPT-2 initialisation: weights N(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weight 1. Deterministic for a seed and independent of thread count.
void init_gpt2(const ParamLayout& layout, uint64_t seed, float* params);

// Throws Error naming the row and position of the first id outside [0, vocab_size) in `rows` rows of `stride`
// ids: a backend checks its input before any id becomes an embedding-table index.
void check_token_ids(const int32_t* ids, int rows, int stride, int vocab_size);

// Training FLOPs per token: 6*N for the matmuls of forward+backward (N counts wte, which is the classifier, but
// not wpe, which is a lookup) plus 12*L*C*T for attention scores and values (PaLM appendix B accounting).
double flops_per_token(const GPTConfig& c, size_t n_params);

}  // namespace yuan
