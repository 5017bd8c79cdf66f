#include "program/program.h"

#include <algorithm>

#include "util/error.h"

namespace yuan {

namespace {

enum Pool { kActivationPool, kBufferPool, kPoolCount };

// Bump allocation in 256-byte steps (cuBLASLt's preferred alignment) over one allocation per pool. Without base
// pointers it only counts: the memory plan is the same walk as the allocation, so the two cannot disagree.
struct BumpAllocator {
  char* base[kPoolCount] = {};
  size_t used[kPoolCount] = {};
  Tensor take(Pool p, DType t, int64_t rows, int64_t cols, int64_t ld = 0) {
    ld = ld ? ld : cols;
    const size_t off = (used[p] + 255) / 256 * 256;
    used[p] = off + static_cast<size_t>(rows * ld) * dtype_size(t);
    return Tensor(base[p] ? base[p] + off : nullptr, t, rows, cols, ld);
  }
};

struct Range {
  int first_layer = 0, end_layer = 0;
  bool embeds = false, heads = false;
};

Range resolve(const GPTConfig& c, ProgramSpec& s) {
  const int n = module_count(c);
  ModuleRange& m = s.modules;
  if (m.size() == 0) m = all_modules(c);
  YUAN_CHECK(m.first >= 0 && m.first < m.end && m.end <= n, "program: modules [%d, %d) outside the model's %d",
             m.first, m.end, n);
  YUAN_CHECK(m.first != kWpeModule && !(m.first == kWteModule && m.end == kWpeModule),
             "program: modules [%d, %d) split wte from wpe; the stage that embeds holds both", m.first, m.end);
  YUAN_CHECK(s.micro_batch >= 1 && s.slots >= 1 && c.seq_len >= 1, "program: micro-batch %d, slots %d, seq_len %d "
             "must be positive", s.micro_batch, s.slots, c.seq_len);
  YUAN_CHECK(s.tp_size >= 1, "program: tensor-parallel size %d", s.tp_size);
  if (s.tp_size > 1) check_tensor_parallel(c, s.tp_size);
  Range r;
  r.embeds = m.first == kWteModule;
  r.heads = m.end == n;
  r.first_layer = std::max(m.first, block_module(0)) - block_module(0);
  r.end_layer = std::max(std::min(m.end, ln_f_module(c)) - block_module(0), r.first_layer);
  return r;
}

}  // namespace

// Every buffer of a program, in one walk that plan() counts and the constructor carves.
struct Program::Buffers {
  std::vector<Slot> slots;
  Block scratch;
  Tensor lnf, lnf_mean, lnf_rstd, logits, losses, row_max, row_sums;
  Tensor dres, dres_op, dln, datty, dqkv, dfch, att_scratch;

  Buffers(BumpAllocator& k, const GPTConfig& c, const TensorFormats& f, const ProgramSpec& s, const Range& r) {
    const int64_t B = s.micro_batch, T = c.seq_len, BT = B * T, C = c.n_embd;
    const int64_t Ct = C / s.tp_size, V = c.vocab_size / s.tp_size;  // this rank's heads' width, its vocabulary
    const int heads = c.n_head / s.tp_size;
    const DType act = f.activations;
    const int layers = r.end_layer - r.first_layer;
    auto block = [&] {
      Block a;
      a.ln1 = k.take(kActivationPool, act, BT, C);
      a.qkv = k.take(kActivationPool, act, BT, 3 * Ct);
      a.atty = k.take(kActivationPool, act, BT, Ct);
      a.res2 = k.take(kActivationPool, act, BT, C);
      a.ln2 = k.take(kActivationPool, act, BT, C);
      a.fch = k.take(kActivationPool, act, BT, 4 * Ct);
      a.fch_gelu = k.take(kActivationPool, act, BT, 4 * Ct);
      a.ln1_mean = k.take(kActivationPool, DType::F32, BT, 1);
      a.ln1_rstd = k.take(kActivationPool, DType::F32, BT, 1);
      a.ln2_mean = k.take(kActivationPool, DType::F32, BT, 1);
      a.ln2_rstd = k.take(kActivationPool, DType::F32, BT, 1);
      a.att_state = k.take(kActivationPool, DType::F32, 1,
                           static_cast<int64_t>(f.attention_state(s.micro_batch, c.seq_len, heads)));
      return a;
    };
    slots.resize(static_cast<size_t>(s.slots));
    for (Slot& sl : slots) {
      if (r.embeds || r.heads)
        sl.tokens = k.take(kBufferPool, DType::I32, 1, static_cast<int64_t>(f.token_slot(s.micro_batch, c.seq_len)));
      sl.x0 = k.take(kActivationPool, act, BT, C);
      if (!s.recompute)
        for (int l = 0; l < layers; l++) sl.blocks.push_back(block());
      for (int l = 0; l < layers; l++) sl.out.push_back(k.take(kActivationPool, act, BT, C));
      // With one slot the head's gradient goes straight into dres, where backward starts.
      if (r.heads && s.slots > 1) sl.head_grad = k.take(kActivationPool, DType::F32, BT, C);
    }
    if (s.recompute && layers > 0) scratch = block();
    if (r.heads) {
      lnf = k.take(kActivationPool, act, BT, C);
      lnf_mean = k.take(kActivationPool, DType::F32, BT, 1);
      lnf_rstd = k.take(kActivationPool, DType::F32, BT, 1);
      logits = k.take(kActivationPool, act, BT, V, f.logits_ld(static_cast<int>(V)));
      losses = k.take(kActivationPool, DType::F32, BT, 1);
      if (s.tp_size > 1) {
        row_max = k.take(kBufferPool, DType::F32, BT, 1);
        row_sums = k.take(kBufferPool, DType::F32, 2, BT);
      }
    }
    dres = k.take(kBufferPool, DType::F32, BT, C);
    if (act != DType::F32) dres_op = k.take(kBufferPool, act, BT, C);  // else the matmuls read dres itself
    dln = k.take(kBufferPool, act, BT, C);
    if (layers > 0) {
      datty = k.take(kBufferPool, act, BT, Ct);
      dqkv = k.take(kBufferPool, act, BT, 3 * Ct);
      dfch = k.take(kBufferPool, act, BT, 4 * Ct);
      att_scratch = k.take(kBufferPool, DType::F32, 1,
                           static_cast<int64_t>(f.attention_scratch(s.micro_batch, c.seq_len, heads,
                                                                    c.n_embd / c.n_head, s.attention)));
    }
  }
};

ProgramMemory Program::plan(const GPTConfig& cfg, const TensorFormats& formats, const ProgramSpec& spec) {
  ProgramSpec s = spec;
  const Range r = resolve(cfg, s);
  BumpAllocator k;
  Buffers(k, cfg, formats, s, r);
  return {k.used[kActivationPool], k.used[kBufferPool]};
}

std::string MemoryPlan::describe() const {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return strf("%.2f GiB (weights %.2f, grads %.2f, activations %.2f, buffers %.2f)", total() / kGiB, weights / kGiB,
              grads / kGiB, activations / kGiB, buffers / kGiB);
}

AttentionChoice choose_attention(Device device, const GPTConfig& c) {
  std::optional<AttentionPath> request;
  if (c.attention == AttentionKernels::Cudnn) request = AttentionPath::Cudnn;
  if (c.attention == AttentionKernels::Own) request = AttentionPath::Own;
  return choose_attention(device, request, c.n_embd / c.n_head, c.seq_len);
}

void check_op_constraints(const GPTConfig& c, Device device, AttentionPath attention) {
  const TensorFormats& f = tensor_formats(device);
  const int w = f.vector_width;
  YUAN_CHECK(c.n_embd % w == 0, "%s backend: n_embd = %d must be a multiple of %d (%zu-byte %s vectors)",
             device_name(device), c.n_embd, w, w * dtype_size(f.activations), dtype_name(f.activations));
  // the ops take heads of any size, or cuDNN takes these (choose_attention asked)
  if ((w == 1 && f.max_head_size == 0) || attention == AttentionPath::Cudnn) return;
  const int hs = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  YUAN_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0 && hs % w == 0 && (f.max_head_size == 0 || hs <= f.max_head_size),
             "%s backend: head size n_embd/n_head = %d/%d must be a multiple of %d%s", device_name(device), c.n_embd,
             c.n_head, w, f.max_head_size ? strf(" and at most %d", f.max_head_size).c_str() : "");
}

MemoryPlan plan_memory(Device device, const GPTConfig& cfg, const ProgramSpec& spec, const ParamMemory& params) {
  const TensorFormats& f = tensor_formats(device);
  const ProgramMemory p = Program::plan(cfg, f, spec);
  MemoryPlan m;
  m.weights = params.weights * dtype_size(f.weights);
  m.grads = params.grads * sizeof(float);
  m.activations = p.activations;
  m.buffers = p.buffers + f.workspace_bytes(cfg.n_embd, spec.micro_batch, cfg.seq_len);
  return m;
}

void check_memory(Device device, const GPTConfig& cfg, const ProgramSpec& spec, const ParamMemory& params,
                  size_t free_bytes) {
  const MemoryPlan plan = plan_memory(device, cfg, spec, params);
  if (plan.total() <= free_bytes) return;
  int fits = 0;  // the largest micro-batch below this one that fits as configured
  ProgramSpec smaller = spec;
  for (int b = spec.micro_batch - 1; b >= 1 && !fits; b--) {
    smaller.micro_batch = b;
    if (plan_memory(device, cfg, smaller, params).total() <= free_bytes) fits = b;
  }
  std::string hint;
  if (fits && !spec.recompute)
    hint = strf("try train.micro_batch=%d or train.recompute=true", fits);
  else if (fits)
    hint = strf("try train.micro_batch=%d", fits);
  else if (!spec.recompute)
    hint = "try train.recompute=true or a smaller model";
  else
    hint = "the model does not fit at micro-batch 1: use a smaller model or more devices";
  throw Error(strf("memory plan: needs %s on the %s device, which has %.2f GiB free; %s", plan.describe().c_str(),
                   device_name(device), free_bytes / (1024.0 * 1024.0 * 1024.0), hint.c_str()));
}

Program::Program(Backend& backend, const ParamLayout& layout, const ProgramSpec& spec, Communicator* tensor,
                 ParamSource* params)
    : backend_(backend), ops_(backend.ops()), layout_(layout),
      own_params_(params ? nullptr : std::make_unique<BackendParams>(backend, layout)),
      params_(params ? *params : *own_params_), tensor_(tensor), cfg_(layout.config()), spec_(spec) {
  YUAN_CHECK(spec.attention == backend.attention(), "program: sized for %s attention on a backend running %s",
             attention_path_name(spec.attention), attention_path_name(backend.attention()));
  check_op_constraints(cfg_, backend.device(), spec.attention);
  const TensorParallel& tp = layout.tp();
  YUAN_CHECK(tp.size == spec.tp_size && (tp.size == 1 || (tensor && tensor->size() == tp.size &&
                                                            tensor->rank() == tp.rank)),
             "program: tensor parallelism over %d ranks needs the layout's part (it holds 1 of %d) and the tensor "
             "group's communicator", spec.tp_size, tp.size);
  tp_size_ = tp.size;
  attention_heads_ = cfg_.n_head / tp.size;
  vocab_begin_ = static_cast<int64_t>(tp.rank) * (cfg_.vocab_size / tp.size);
  const Range r = resolve(cfg_, spec_);
  first_layer_ = r.first_layer;
  end_layer_ = r.end_layer;
  embeds_ = r.embeds;
  runs_head_ = r.heads;
  for (int m = spec_.modules.first; m < spec_.modules.end; m++)
    YUAN_CHECK(layout_.has(m), "program: module %d of [%d, %d) is not in the backend's layout", m,
               spec_.modules.first, spec_.modules.end);
  YUAN_CHECK(!runs_head_ || layout_.has(kWteModule), "program: the head needs wte (the tied classifier) in the "
             "layout");

  BumpAllocator k;
  const TensorFormats& f = backend.formats();
  Buffers(k, cfg_, f, spec_, r);
  for (int p = 0; p < kPoolCount; p++) {
    memory_[p] = backend.alloc(k.used[p], p == kActivationPool ? Mem::Activations : Mem::Comm);
    k.base[p] = memory_[p].as<char>();
    k.used[p] = 0;
  }
  Buffers m(k, cfg_, f, spec_, r);
  slots_ = std::move(m.slots);
  scratch_ = m.scratch;
  lnf_ = m.lnf, lnf_mean_ = m.lnf_mean, lnf_rstd_ = m.lnf_rstd, logits_ = m.logits, losses_ = m.losses;
  row_max_ = m.row_max, row_sums_ = m.row_sums;
  dres_ = m.dres, dres_op_ = m.dres_op, dln_ = m.dln, datty_ = m.datty, dqkv_ = m.dqkv, dfch_ = m.dfch;
  att_scratch_ = m.att_scratch;
  host_losses_.resize(static_cast<size_t>(spec_.micro_batch) * cfg_.seq_len);
}

void Program::check_slot(int slot, const char* what) const {
  YUAN_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "program: %s of micro-batch slot %d outside [0, %zu)",
             what, slot, slots_.size());
}

Tensor Program::rows(const Tensor& t, int slot) const {
  const Slot& s = slots_[slot];
  return t.first_rows(static_cast<int64_t>(s.B) * s.T);
}

Program::Block& Program::acts(int slot, int layer) {
  return spec_.recompute ? scratch_ : slots_[slot].blocks[layer - first_layer_];
}

const Tensor& Program::block_input(int slot, int layer) const {
  const Slot& s = slots_[slot];
  return layer == first_layer_ ? s.x0 : s.out[layer - 1 - first_layer_];
}

const Tensor& Program::stage_output(int slot) const {
  const Slot& s = slots_[slot];
  return s.out.empty() ? s.x0 : s.out.back();
}

Tensor Program::output(int slot) const {
  check_slot(slot, "output");
  return rows(stage_output(slot), slot);
}

Tensor Program::input_buffer(int slot, int B) const {
  check_slot(slot, "input");
  return slots_[slot].x0.first_rows(static_cast<int64_t>(B) * cfg_.seq_len);
}

Tensor Program::input_grad(int slot) const {
  check_slot(slot, "input_grad");
  return rows(dres_, slot);
}

Tensor Program::dres_operand(int slot, bool for_layernorm) const {
  if (dres_op_) return rows(dres_op_, slot);
  return for_layernorm ? Tensor() : rows(dres_, slot);
}

// ---- forward ----

void Program::forward(int slot, const int32_t* tokens, int B) {
  check_slot(slot, "forward");
  run_forward(slot, tokens, B, cfg_.seq_len, cfg_.seq_len + 1);
}

void Program::run_forward(int slot, const int32_t* tokens, int B, int T, int stride) {
  YUAN_CHECK(B >= 1 && B <= spec_.micro_batch, "program: micro-batch %d outside [1, %d]", B, spec_.micro_batch);
  Slot& s = slots_[slot];
  s.B = B, s.T = T, s.stride = stride;
  if (embeds_ || runs_head_) {
    check_token_ids(tokens, B, stride, cfg_.vocab_size);
    const Tensor tok(s.tokens.data, DType::I32, B, stride);
    ops_.load_tokens(tok, tokens);
  }
  const ParamLayout& L = layout_;
  if (embeds_) {
    // Each tensor rank looks up the ids of its part of the vocabulary and one adds the positions: the sum is
    // the embedding.
    const bool positions = L.tp().rank == 0;
    params_.acquire(kWteModule, false);
    params_.acquire(kWpeModule, false);
    ops_.encoder_forward(rows(s.x0, slot), Tensor(s.tokens.data, DType::I32, B, stride), params_.weight(L.wte()),
                         positions ? params_.weight(L.wpe()) : Tensor(), B, T, vocab_begin_);
    params_.release(kWpeModule);
    params_.release(kWteModule);
    if (tp()) tp_reduce(rows(s.x0, slot), ReduceOp::Sum);
  }
  for (int l = first_layer_; l < end_layer_; l++) {
    params_.acquire(block_module(l), false);
    block_forward(slot, l, true);
    params_.release(block_module(l));
  }
}

void Program::tp_reduce(const Tensor& t, ReduceOp op) {
  tensor_->all_reduce(t.data, t.numel(), t.dtype, op);
  backend_.compute_after(tensor_->stream());
}

void Program::block_forward(int slot, int l, bool keep_output) {
  const Slot& s = slots_[slot];
  const ParamLayout& L = layout_;
  auto W = [&](BlockTensor t) { return params_.weight(L.block(l, t)); };
  const Block& a = acts(slot, l);
  const Tensor x = rows(block_input(slot, l), slot), res2 = rows(a.res2, slot);
  ops_.layernorm_forward(rows(a.ln1, slot), rows(a.ln1_mean, slot), rows(a.ln1_rstd, slot), x, W(kLn1W), W(kLn1B));
  ops_.matmul_forward(rows(a.qkv, slot), rows(a.ln1, slot), W(kQkvW), W(kQkvB), {}, {});
  ops_.attention_forward(rows(a.atty, slot), a.att_state, att_scratch_, rows(a.qkv, slot), s.B, s.T,
                         attention_heads_);
  row_parallel(res2, rows(a.atty, slot), W(kAttnProjW), W(kAttnProjB), x);
  ops_.layernorm_forward(rows(a.ln2, slot), rows(a.ln2_mean, slot), rows(a.ln2_rstd, slot), res2, W(kLn2W),
                         W(kLn2B));
  ops_.matmul_forward(rows(a.fch_gelu, slot), rows(a.ln2, slot), W(kFcW), W(kFcB), {}, rows(a.fch, slot));
  if (keep_output)
    row_parallel(rows(slots_[slot].out[l - first_layer_], slot), rows(a.fch_gelu, slot), W(kFcProjW), W(kFcProjB),
                 res2);
  scratch_slot_ = slot, scratch_layer_ = l;
}

void Program::row_parallel(const Tensor& out, const Tensor& in, const Tensor& w, const Tensor& bias,
                           const Tensor& residual) {
  if (!tp()) {
    ops_.matmul_forward(out, in, w, bias, residual, {});
    return;
  }
  // Each rank's columns of the weight give a partial product; bias and residual join once, after the sum.
  ops_.matmul_forward(out, in, w, {}, {}, {});
  tp_reduce(out, ReduceOp::Sum);
  ops_.bias_residual(out, bias, residual);
}

void Program::head_forward(int slot) {
  const ParamLayout& L = layout_;
  ops_.layernorm_forward(rows(lnf_, slot), rows(lnf_mean_, slot), rows(lnf_rstd_, slot), output(slot),
                         params_.weight(L.ln_f_w()), params_.weight(L.ln_f_b()));
  ops_.matmul_forward(rows(logits_, slot), rows(lnf_, slot), params_.weight(L.wte()), {}, {}, {});
}

float Program::loss(int slot, float grad_scale) {
  check_slot(slot, "loss");
  YUAN_CHECK(runs_head_, "program: loss on a stage without the head (modules [%d, %d))", spec_.modules.first,
             spec_.modules.end);
  Slot& s = slots_[slot];
  YUAN_CHECK(s.stride == s.T + 1, "program: loss needs targets (rows of T+1 ids)");
  const int BT = s.B * s.T;
  // The head's backward follows at once, so its gradients are taken here (and reported with backward()).
  const int lnf = ln_f_module(cfg_);
  params_.acquire(lnf, grad_scale != 0.0f);
  params_.acquire(kWteModule, grad_scale != 0.0f);
  head_forward(slot);
  const Tensor logits = rows(logits_, slot), losses = rows(losses_, slot);
  const Tensor tokens(s.tokens.data, DType::I32, s.B, s.stride);
  const float dscale = grad_scale / static_cast<float>(BT);
  if (!tp()) {
    ops_.classifier(logits, losses, tokens, s.B, s.T, dscale);
  } else {
    // The vocabulary-parallel cross-entropy: each rank's logits reduced to row maxima and sums over the ranks.
    const Tensor row_max = row_max_.first_rows(BT), sums(row_sums_.data, DType::F32, 2, BT, row_sums_.ld);
    ops_.classifier_row_max(logits, row_max);
    tp_reduce(row_max, ReduceOp::Max);
    ops_.classifier_row_sums(logits, row_max, tokens, s.B, s.T, vocab_begin_, sums);
    tp_reduce(sums, ReduceOp::Sum);
    ops_.classifier_finish(logits, losses, row_max, sums, tokens, s.B, s.T, vocab_begin_, dscale);
  }
  if (grad_scale != 0.0f) {
    // The logits now hold their gradient: back through the tied classifier and ln_f.
    backend_.compute_after_transfers();
    const ParamLayout& L = layout_;
    const Tensor dy = rows(spec_.slots > 1 ? s.head_grad : dres_, slot);
    ops_.zero(dy);
    ops_.matmul_backward(rows(dln_, slot), params_.grad(L.wte()), {}, logits, rows(lnf_, slot),
                         params_.weight(L.wte()), {});
    if (tp()) tp_reduce(rows(dln_, slot), ReduceOp::Sum);  // each rank's vocabulary gave part of it
    ops_.layernorm_backward(dy, dres_operand(slot, true), params_.grad(L.ln_f_w()),
                            params_.grad(L.ln_f_b()), rows(dln_, slot), output(slot), params_.weight(L.ln_f_w()),
                            rows(lnf_mean_, slot), rows(lnf_rstd_, slot));
  }
  params_.release(kWteModule);
  params_.release(lnf);
  ops_.to_host_f32(host_losses_.data(), rows(losses_, slot));
  double sum = 0;
  for (int i = 0; i < BT; i++) sum += host_losses_[i];
  return static_cast<float>(sum / BT);
}

// ---- backward ----

void Program::backward(int slot, const Tensor& dout, const ModuleReadyFn& ready) {
  check_slot(slot, "backward");
  Slot& s = slots_[slot];
  YUAN_CHECK(s.stride == s.T + 1, "program: backward of a forward without targets");
  backend_.compute_after_transfers();
  const Tensor dres = rows(dres_, slot);
  const Tensor from = runs_head_ ? (spec_.slots > 1 ? rows(s.head_grad, slot) : dres) : dout;
  YUAN_CHECK(from.data && from.dtype == DType::F32 && from.rows == dres.rows && from.cols == dres.cols,
             "program: backward needs the fp32 [%lld, %lld] gradient of the stage output",
             static_cast<long long>(dres.rows), static_cast<long long>(dres.cols));
  if (from.data != dres.data) {
    ops_.copy(dres, from);
    if (dres_op_) ops_.copy(dres_operand(slot, true), dres);
  }
  // The head's gradients were taken with the loss; they are reported with the micro-batch's backward, so that
  // every module is reported once per backward in schedule order.
  if (runs_head_) {
    notify(ready, ln_f_module(cfg_));
    if (!embeds_) notify(ready, kWteModule);  // the tied classifier's copy of wte is complete
  }
  for (int l = end_layer_ - 1; l >= first_layer_; l--) {
    params_.acquire(block_module(l), true);
    // The recompute set still holds the block whose forward ran last; every other block runs again.
    if (spec_.recompute && !(scratch_slot_ == slot && scratch_layer_ == l)) block_forward(slot, l, false);
    block_backward(slot, l);
    params_.release(block_module(l));
    notify(ready, block_module(l));
  }
  if (embeds_) {
    const ParamLayout& L = layout_;
    params_.acquire(kWteModule, true);
    params_.acquire(kWpeModule, true);
    ops_.encoder_backward(params_.grad(L.wte()), params_.grad(L.wpe()), dres,
                          Tensor(s.tokens.data, DType::I32, s.B, s.stride), s.B, s.T, vocab_begin_);
    params_.release(kWpeModule);
    params_.release(kWteModule);
    notify(ready, kWpeModule);
    notify(ready, kWteModule);
  }
}

void Program::block_backward(int slot, int l) {
  const ParamLayout& L = layout_;
  auto W = [&](BlockTensor t) { return params_.weight(L.block(l, t)); };
  auto G = [&](BlockTensor t) { return params_.grad(L.block(l, t)); };
  const Slot& s = slots_[slot];
  const Block& a = acts(slot, l);
  const Tensor dres = rows(dres_, slot), dres_op = dres_operand(slot, false), dln = rows(dln_, slot);
  const Tensor dfch = rows(dfch_, slot), datty = rows(datty_, slot), dqkv = rows(dqkv_, slot);
  // out = res2 + fcproj: dres flows unchanged into both
  ops_.matmul_backward(dfch, G(kFcProjW), G(kFcProjB), dres_op, rows(a.fch_gelu, slot), W(kFcProjW),
                       rows(a.fch, slot));
  ops_.matmul_backward(dln, G(kFcW), G(kFcB), dfch, rows(a.ln2, slot), W(kFcW), {});
  if (tp()) tp_reduce(dln, ReduceOp::Sum);  // the column-parallel layer's input gradient: each rank's part
  ops_.layernorm_backward(dres, dres_operand(slot, true), G(kLn2W), G(kLn2B), dln, rows(a.res2, slot), W(kLn2W),
                          rows(a.ln2_mean, slot), rows(a.ln2_rstd, slot));
  // res2 = x + attproj
  ops_.matmul_backward(datty, G(kAttnProjW), G(kAttnProjB), dres_op, rows(a.atty, slot), W(kAttnProjW), {});
  ops_.attention_backward(dqkv, att_scratch_, datty, rows(a.qkv, slot), rows(a.atty, slot), a.att_state, s.B, s.T,
                          attention_heads_);
  ops_.matmul_backward(dln, G(kQkvW), G(kQkvB), dqkv, rows(a.ln1, slot), W(kQkvW), {});
  if (tp()) tp_reduce(dln, ReduceOp::Sum);
  ops_.layernorm_backward(dres, dres_operand(slot, true), G(kLn1W), G(kLn1B), dln, rows(block_input(slot, l), slot),
                          W(kLn1W), rows(a.ln1_mean, slot), rows(a.ln1_rstd, slot));
}

// ---- the whole model ----

float Program::forward_backward(const int32_t* tokens, int B, float grad_scale, const ModuleReadyFn& ready) {
  YUAN_CHECK(embeds_ && runs_head_, "program: forward_backward runs the whole model");
  run_forward(0, tokens, B, cfg_.seq_len, cfg_.seq_len + 1);
  const float loss = this->loss(0, grad_scale);
  backward(0, {}, ready);
  return loss;
}

float Program::forward_loss(const int32_t* tokens, int B) {
  YUAN_CHECK(embeds_ && runs_head_, "program: forward_loss runs the whole model");
  run_forward(0, tokens, B, cfg_.seq_len, cfg_.seq_len + 1);
  return loss(0, 0.0f);
}

void Program::forward_logits(const int32_t* ids, int len, float* logits) {
  YUAN_CHECK(embeds_ && runs_head_, "program: forward_logits runs the whole model");
  YUAN_CHECK(len >= 1 && len <= cfg_.seq_len, "forward_logits: length %d outside [1, seq_len=%d]", len,
             cfg_.seq_len);
  run_forward(0, ids, 1, len, len);
  params_.acquire(ln_f_module(cfg_), false);
  params_.acquire(kWteModule, false);
  head_forward(0);
  params_.release(kWteModule);
  params_.release(ln_f_module(cfg_));
  ops_.to_host_f32(logits, rows(logits_, 0));
}

}  // namespace yuan
