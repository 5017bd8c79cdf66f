// The GPT forward and backward, written once, over a contiguous range of the model's modules, against the op
// vocabulary of backend/ops_interface.h. A whole model, a pipeline stage and a recomputed block are this same code:
//
//   embedding (wte, wpe)  ->  blocks h.i  ->  head (ln_f, then the logits through the tied wte, the loss)
//
//   block forward:  ln1 = LN(x);  qkv = ln1 Wqkv + b;  atty = attention(qkv);  res2 = atty Wproj + b + x;
//                   ln2 = LN(res2);  fch = ln2 Wfc + b;  fch_gelu = gelu(fch);  out = fch_gelu Wfcproj + b + res2
//   block backward: the same in reverse; the residual stream's gradient `dres` (fp32) flows through both residual
//                   adds unchanged and collects each LayerNorm's input gradient.
//
// A program runs on one backend whose flat buffers hold a parameter layout with its modules (and wte when it
// computes the head without the embedding: the tied classifier of a last pipeline stage). It keeps the
// activations of up to `slots` micro-batches (a pipeline schedule has several in flight; data parallelism needs
// one) and one set of backward scratch. With `recompute`, each block keeps only its output and backward re-runs a
// block's forward into one shared set before its backward: activations shrink from 16 values per token, channel
// and layer to 1, for about one more forward pass of compute.
//
// Weights and gradients come from a ParamSource (program/params.h): the backend's flat buffers, or ZeRO-3's
// gathered modules, acquired around each module's use. Gradients accumulate there; `ready` hooks report each
// module once its gradient for the micro-batch is complete (in stream order), so that communication can overlap
// the rest of backward.
//
// With tensor parallelism (Megatron-LM) the backend holds this rank's part of each tensor (model/gpt.h TpSplit)
// and the program its heads and its part of the MLP and of the vocabulary; the ranks of the tensor group sum
// their partial results with an all-reduce after the attention's projection and after the MLP (forward), after
// the two column-parallel layers' input gradients (backward), for the embedding, and inside the vocabulary-
// parallel cross-entropy, which never gathers the full logits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/gpt.h"
#include "program/params.h"

namespace yuan {

struct ProgramSpec {
  ModuleRange modules;                   // the modules this program runs; empty: every module
  int micro_batch = 1;                   // rows of the largest micro-batch
  int slots = 1;                         // micro-batches whose activations are kept at once
  bool recompute = false;
  int tp_size = 1;                       // tensor-parallel ranks (the program's layout is one rank's part)
  AttentionPath attention = AttentionPath::Own;  // the backend's (BackendSpec::attention): sizes its scratch
};

// Device bytes of a program by purpose (the memory plan; src/backend's own buffers are extra).
struct ProgramMemory {
  size_t activations = 0;  // kept from forward for backward, per slot, and the head's logits
  size_t buffers = 0;      // backward scratch and token buffers
};

// The parameters' device memory, in elements: working weights and fp32 gradients. A backend holding n parameters
// whole has n of each; under ZeRO-3, the shards and the gathered modules (optim/zero.h zero_param_memory).
struct ParamMemory {
  size_t weights = 0, grads = 0;
  ParamMemory(size_t n) : weights(n), grads(n) {}  // NOLINT(google-explicit-constructor): n whole parameters
  ParamMemory(size_t w, size_t g) : weights(w), grads(g) {}
};

// Whose attention kernels a model of `c` runs on `device`, as c.attention asks (backend/backend.h
// choose_attention: Auto leaves it to the backend, which knows devices and not the model's config).
AttentionChoice choose_attention(Device device, const GPTConfig& c);

// Throws Error when `device`'s ops cannot run a model of shape `c` (TensorFormats::vector_width, max_head_size):
// "cuda backend: n_embd = 100 must be a multiple of 8 (16-byte bf16 vectors)". Where a model meets a backend: a
// Program's construction, and a rank's plan before anything is allocated (train/memory_plan.h plan_rank).
void check_op_constraints(const GPTConfig& c, Device device, AttentionPath attention);

// Device bytes of a backend and a program of `spec` on it, by purpose: what make_backend (parameter memory
// `params`, its own workspace) and the Program (or ZeRO-3's gathered modules) allocate. Needs no device.
struct MemoryPlan {
  size_t weights = 0;      // working weights
  size_t grads = 0;        // fp32 gradients
  size_t activations = 0;  // kept from forward for backward, logits included
  size_t buffers = 0;      // backward scratch, token buffers, the backend's workspace
  size_t total() const { return weights + grads + activations + buffers; }
  std::string describe() const;  // "X GiB (weights ..., grads ..., activations ..., buffers ...)"
};
MemoryPlan plan_memory(Device device, const GPTConfig& cfg, const ProgramSpec& spec, const ParamMemory& params);
// Before anything is allocated: throws the one-line Error "memory plan: needs X GiB on the cuda device (...),
// device has Y GiB free; try ..." (a smaller train.micro_batch or train.recompute=true) when the plan does not
// fit in `free_bytes`.
void check_memory(Device device, const GPTConfig& cfg, const ProgramSpec& spec, const ParamMemory& params,
                  size_t free_bytes);

class Program {
 public:
  // `layout`: the parameters the backend's flat buffers hold (program/params.h backend_spec). `tensor`: the tensor
  // group's communicator, for spec.tp_size > 1. `params`: where the weights and gradients are (null: the
  // backend's buffers, BackendParams).
  Program(Backend& backend, const ParamLayout& layout, const ProgramSpec& spec, Communicator* tensor = nullptr,
          ParamSource* params = nullptr);
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  // What a program of `spec` allocates on a backend storing tensors in `formats`; needs no backend.
  static ProgramMemory plan(const GPTConfig& cfg, const TensorFormats& formats, const ProgramSpec& spec);

  Backend& backend() { return backend_; }
  const ParamLayout& layout() const { return layout_; }
  int micro_batch() const { return spec_.micro_batch; }
  bool embeds() const { return embeds_; }        // first stage: runs wte and wpe
  bool runs_head() const { return runs_head_; }  // last stage: runs ln_f and the loss

  // ---- one stage of a pipeline (or the whole model), micro-batch by micro-batch ----
  // `tokens`: B rows of T+1 ids (T = seq_len), read by the stages that embed or compute the loss (others may pass
  // null). A stage that does not embed reads its input from input_buffer(slot), where the caller has put the
  // previous stage's output() for this micro-batch.
  void forward(int slot, const int32_t* tokens, int B);
  // [B*T, C] in the activation dtype: the last block's output of the slot's forward.
  Tensor output(int slot) const;
  // [B*T, C] in the activation dtype: where a stage that does not embed receives its input for a forward of B rows.
  Tensor input_buffer(int slot, int B) const;
  // Stages that head: the slot's mean loss; with grad_scale != 0 also the head's backward, accumulating the
  // gradient of grad_scale * mean loss (reported ready by the slot's backward).
  float loss(int slot, float grad_scale);
  // Backward of the slot: from the head's gradient (stages that head) or from `dout`, the gradient of output()
  // in fp32. Afterwards input_grad(slot) holds the gradient of the stage's input (fp32), for the previous stage,
  // until the next backward.
  void backward(int slot, const Tensor& dout, const ModuleReadyFn& ready);
  Tensor input_grad(int slot) const;

  // ---- the whole model (embeds and heads) ----
  // Adds d(grad_scale * mean loss)/d(params) into the gradients and returns the mean loss of B rows of T+1 ids.
  float forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready);
  float forward_loss(const int32_t* tokens, int B);
  // Logits at every position of one row of `len` <= seq_len input ids: len x vocab_size values.
  void forward_logits(const int32_t* ids, int len, float* logits);

 private:
  struct Block {  // what one block's forward keeps for its backward
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, att_state, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  struct Slot {
    Tensor tokens;              // token buffer (stages that embed or head)
    Tensor x0;                  // the stage's input: the embedding, or the previous stage's output
    std::vector<Block> blocks;  // one per block, or none with recompute
    std::vector<Tensor> out;    // each block's output
    Tensor head_grad;           // the head's gradient of the last block's output, until backward takes it
    int B = 0, T = 0, stride = 0;
  };
  struct Buffers;  // the walk over every buffer, shared by plan() and the constructor
  void run_forward(int slot, const int32_t* tokens, int B, int T, int stride);
  void block_forward(int slot, int layer, bool keep_output);
  void block_backward(int slot, int layer);
  void head_forward(int slot);
  // out = in @ w^T + bias + residual for a layer whose input is split over the tensor ranks (attn.c_proj,
  // mlp.c_proj): each rank's product is partial until the sum.
  void row_parallel(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias, const Tensor& residual);
  Block& acts(int slot, int layer);
  const Tensor& block_input(int slot, int layer) const;
  const Tensor& stage_output(int slot) const;
  Tensor rows(const Tensor& t, int slot) const;  // the slot's B*T rows of a [rows, C] buffer
  // What the matmuls read of dres (its activation-dtype copy, or dres itself when there is none); for a
  // LayerNorm backward, the copy it refreshes (empty when there is none).
  Tensor dres_operand(int slot, bool for_layernorm) const;
  void check_slot(int slot, const char* what) const;
  void notify(const ModuleReadyFn& ready, int module) const {
    if (ready) ready(module);
  }
  // Sums (or maxes) `t` over the tensor group, and orders the compute after it.
  void tp_reduce(const Tensor& t, ReduceOp op);
  bool tp() const { return tp_size_ > 1; }

  Backend& backend_;
  Ops& ops_;
  const ParamLayout layout_;
  std::unique_ptr<ParamSource> own_params_;  // the backend's buffers, when no other source is given
  ParamSource& params_;
  Communicator* tensor_;
  const GPTConfig cfg_;
  ProgramSpec spec_;
  int tp_size_ = 1;
  int attention_heads_ = 0;    // attention heads of this rank
  int64_t vocab_begin_ = 0;    // the first id of this rank's part of the vocabulary
  int first_layer_ = 0, end_layer_ = 0;  // the blocks [first, end) of the range
  bool embeds_ = false, runs_head_ = false;
  Allocation memory_[2];  // activations, buffers
  std::vector<Slot> slots_;
  Block scratch_;     // the recompute set
  int scratch_slot_ = -1, scratch_layer_ = -1;  // whose forward the recompute set holds
  // the head (shared by the slots: the loss and its gradient are taken as soon as the logits exist)
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  Tensor row_max_, row_sums_;  // the vocabulary-parallel cross-entropy's reductions (tensor parallelism)
  // backward scratch
  // dres_op_: empty when activations are fp32. att_scratch_: the attention's, forward and backward (one stream).
  Tensor dres_, dres_op_, dln_, datty_, dqkv_, dfch_, att_scratch_;
  std::vector<float> host_losses_;
};

}  // namespace yuan
