// GPT-2 model description: shape, the parameter table, initialisation and cost.
//
// All parameters live in ONE flat fp32 buffer. The table below orders them by module
//   wte, wpe, h.0 ... h.{L-1}, ln_f
// and each module is a contiguous range, so optimizer sharding, gradient buckets, checkpoints, export and
// pipeline stages all work on [offset, offset+numel) ranges. Tensor names follow HuggingFace GPT-2 without the
// "transformer." prefix. Matrices are stored [out, in] (nn.Linear layout); export transposes to Conv1D.
//
// A layout may hold a subset of the modules (a pipeline stage) and, with tensor parallelism, one rank's part of
// each tensor (Megatron's cut, TpSplit); global_runs() maps any range of it back to the whole model's buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/names.h"

namespace yuan {

// Whose attention kernels a run asks for on a GPU (model.attention): cuDNN's fused attention where it runs the
// model's shape, else this project's (Auto); cuDNN's or refuse to start (Cudnn); this project's (Own).
enum class AttentionKernels { Auto, Cudnn, Own };
template <>
struct Names<AttentionKernels> {
  static constexpr std::array<const char*, 3> names{"auto", "cudnn", "own"};
};

struct GPTConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int seq_len = 0;     // maximum context = rows of wpe
  int vocab_size = 0;  // rows of wte (tied with the output classifier)
  // Whose attention kernels run on a GPU (program/program.h choose_attention). Not the model's math, which is the
  // same on both; the key sits here because the model's shape decides what cuDNN takes.
  AttentionKernels attention = AttentionKernels::Auto;
};

// How a tensor is cut over the tensor-parallel ranks (Megatron-LM): the column-parallel layers (attn.c_attn, with
// each rank's heads of q, k and v; mlp.c_fc) and the vocabulary of wte keep a block of rows per rank, the
// row-parallel ones (attn.c_proj, mlp.c_proj) a block of columns; everything else is replicated.
enum class TpSplit { Replicated, Rows, Columns };

struct TensorParallel {
  int rank = 0, size = 1;
};

struct TensorSpec {
  std::string name;            // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // this layout's part, row-major
  size_t offset = 0;           // into the flat buffer, in elements
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies to matrices and embeddings (dim >= 2), not biases/LN
  int module = 0;      // the module's index (see module indices below)
  int id = 0;          // position in the whole model's table, whatever subset this layout holds
  TpSplit split = TpSplit::Replicated;
  int row_blocks = 1;                // Rows: blocks cut separately (q, k, v: 3)
  std::vector<int64_t> full_shape;   // the whole tensor's shape
  size_t global_offset = 0;          // where the whole tensor starts in the whole model's buffer
};

struct ModuleSpec {
  std::string name;  // "wte", "wpe", "h.0", ..., "ln_f"
  int index = 0;     // the module's index in the whole model
  size_t offset = 0;
  size_t numel = 0;
  int first_tensor = 0;  // into ParamLayout::tensors()
  int n_tensors = 0;
};

// Module indices, fixed by the model: 0 wte, 1 wpe, 2 + l for block l, n_layer + 2 ln_f.
constexpr int kWteModule = 0, kWpeModule = 1;
inline int block_module(int layer) { return 2 + layer; }
inline int ln_f_module(const GPTConfig& c) { return c.n_layer + 2; }
inline int module_count(const GPTConfig& c) { return c.n_layer + 3; }

// A contiguous run of modules [first, end): what a pipeline stage runs.
struct ModuleRange {
  int first = 0, end = 0;
  bool contains(int module) const { return module >= first && module < end; }
  int size() const { return end - first; }
  bool operator==(const ModuleRange& o) const { return first == o.first && end == o.end; }
};
inline ModuleRange all_modules(const GPTConfig& c) { return {0, module_count(c)}; }
// The modules whose parameters a stage running `range` holds: the range, and wte when the range ends with the
// head but does not embed (the last stage's copy of the tied classifier).
std::vector<int> held_modules(const GPTConfig& c, const ModuleRange& range);

// Offsets of the 12 tensors inside one transformer block, in table order.
enum BlockTensor {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kBlockTensors
};

// The parameter table of the whole model, or of a subset of its modules (a pipeline stage), whole or as one
// tensor-parallel rank's part: the tensors keep their names, module indices and ids, and are packed in module
// order from offset 0.
class ParamLayout {
 public:
  explicit ParamLayout(const GPTConfig& c);
  // `modules`: indices in increasing order, each at most once; throws naming the bad index. A tp of more than one
  // rank needs n_head, 4 n_embd and vocab_size divisible by its size (check_tensor_parallel).
  ParamLayout(const GPTConfig& c, const std::vector<int>& modules, TensorParallel tp = {});
  const GPTConfig& config() const { return cfg_; }
  const TensorParallel& tp() const { return tp_; }
  // Contiguous pieces of [offset, offset + count) of this layout's buffer in the whole model's (ParamLayout of
  // config()), in this layout's order: `local` offsets are this layout's.
  struct Run {
    size_t local = 0, global = 0, count = 0;
  };
  std::vector<Run> global_runs(size_t offset, size_t count) const;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<ModuleSpec>& modules() const { return modules_; }  // the held ones, in index order
  size_t total() const { return total_; }
  bool has(int module) const;
  const ModuleSpec& module(int index) const;              // throws naming the module when it is not held
  const TensorSpec& find(const std::string& name) const;  // throws Error naming the tensor
  const TensorSpec& wte() const { return tensor_of(kWteModule, 0); }
  const TensorSpec& wpe() const { return tensor_of(kWpeModule, 0); }
  const TensorSpec& block(int layer, BlockTensor t) const { return tensor_of(block_module(layer), t); }
  const TensorSpec& ln_f_w() const { return tensor_of(ln_f_module(cfg_), 0); }
  const TensorSpec& ln_f_b() const { return tensor_of(ln_f_module(cfg_), 1); }

 private:
  const TensorSpec& tensor_of(int module, int k) const { return tensors_[this->module(module).first_tensor + k]; }
  GPTConfig cfg_;
  TensorParallel tp_;
  std::vector<TensorSpec> tensors_;
  std::vector<ModuleSpec> modules_;
  std::vector<int> position_;  // module index -> position in modules_, -1 when not held
  size_t total_ = 0;
};

// [lo, hi) of a flat buffer cut where weight decay changes (TensorSpec::decay; off past layout.total(), the
// padding), in absolute offsets.
struct DecaySegment {
  size_t offset = 0, count = 0;
  bool decay = false;
};
std::vector<DecaySegment> decay_segments(const ParamLayout& layout, size_t lo, size_t hi);

// Throws a collective Error naming parallel.tp_size when the model does not split over `tp_size` ranks: heads,
// the MLP's 4 n_embd and the vocabulary must divide.
void check_tensor_parallel(const GPTConfig& c, int tp_size);

// GPT-2 initialisation: weights N(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weight 1. Deterministic for a seed and independent of thread count; a pipeline stage or a
// tensor-parallel part gets exactly the whole model's values of what it holds. `params` receives the layout's
// range [offset, offset + count) (clipped to the layout): a rank initialises its shard without the whole model.
void init_gpt2(const ParamLayout& layout, uint64_t seed, float* params, size_t offset = 0, size_t count = SIZE_MAX);

// Throws Error naming the row and position of the first id outside [0, vocab_size) in `rows` rows of `stride`
// ids: a backend checks its input before any id becomes an embedding-table index.
void check_token_ids(const int32_t* ids, int rows, int stride, int vocab_size);

// Training FLOPs per token: 6*N for the matmuls of forward+backward (N counts wte, which is the classifier, but
// not wpe, which is a lookup) plus 12*L*C*T for attention scores and values (PaLM appendix B accounting).
double flops_per_token(const GPTConfig& c, size_t n_params);

}  // namespace yuan
