#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/error.h"
#include "util/rng.h"

namespace yuan {

namespace {

// One tensor of a module: its name after the module's, its whole shape, and its tensor-parallel cut.
struct TensorDef {
  const char* suffix;
  std::vector<int64_t> shape;
  TpSplit split = TpSplit::Replicated;
  int row_blocks = 1;
};

// The tensors of one module in table order.
std::vector<TensorDef> module_tensors(const GPTConfig& c, int module) {
  const int64_t C = c.n_embd, V = c.vocab_size, T = c.seq_len;
  using S = TpSplit;
  if (module == kWteModule) return {{"weight", {V, C}, S::Rows}};
  if (module == kWpeModule) return {{"weight", {T, C}}};
  if (module == ln_f_module(c)) return {{"weight", {C}}, {"bias", {C}}};
  return {{"ln_1.weight", {C}},
          {"ln_1.bias", {C}},
          {"attn.c_attn.weight", {3 * C, C}, S::Rows, 3},
          {"attn.c_attn.bias", {3 * C}, S::Rows, 3},
          {"attn.c_proj.weight", {C, C}, S::Columns},
          {"attn.c_proj.bias", {C}},
          {"ln_2.weight", {C}},
          {"ln_2.bias", {C}},
          {"mlp.c_fc.weight", {4 * C, C}, S::Rows},
          {"mlp.c_fc.bias", {4 * C}, S::Rows},
          {"mlp.c_proj.weight", {C, 4 * C}, S::Columns},
          {"mlp.c_proj.bias", {C}}};
}

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string module_name(const GPTConfig& c, int module) {
  if (module == kWteModule) return "wte";
  if (module == kWpeModule) return "wpe";
  if (module == ln_f_module(c)) return "ln_f";
  return "h." + std::to_string(module - 2);
}

}  // namespace

std::vector<int> held_modules(const GPTConfig& c, const ModuleRange& range) {
  std::vector<int> m;
  if (range.end == module_count(c) && range.first > kWteModule) m.push_back(kWteModule);
  for (int i = range.first; i < range.end; i++) m.push_back(i);
  return m;
}

ParamLayout::ParamLayout(const GPTConfig& c) : ParamLayout(c, held_modules(c, all_modules(c))) {}

ParamLayout::ParamLayout(const GPTConfig& c, const std::vector<int>& modules, TensorParallel tp)
    : cfg_(c), tp_(tp), position_(static_cast<size_t>(std::max(module_count(c), 0)), -1) {
  YUAN_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "parameter layout: tensor rank %d of %d", tp.rank,
             tp.size);
  if (tp.size > 1) check_tensor_parallel(c, tp.size);
  int id = 0, next = 0;  // id of the first tensor of module `next`
  size_t global = 0;     // where module `next` starts in the whole model
  for (int index : modules) {
    YUAN_CHECK(index >= 0 && index < module_count(c) && position_[index] < 0 && (modules_.empty() ||
               index > modules_.back().index), "parameter layout: module %d out of order, repeated or outside the "
               "%d modules of the model", index, module_count(c));
    for (; next < index; next++)
      for (const TensorDef& d : module_tensors(c, next)) global += numel_of(d.shape), id++;
    ModuleSpec m;
    m.name = module_name(c, index);
    m.index = index;
    m.offset = total_;
    m.first_tensor = static_cast<int>(tensors_.size());
    for (const TensorDef& d : module_tensors(c, index)) {
      TensorSpec t;
      t.name = m.name + "." + d.suffix;
      t.full_shape = d.shape;
      t.shape = d.shape;
      t.split = tp.size > 1 ? d.split : TpSplit::Replicated;
      t.row_blocks = d.row_blocks;
      if (t.split == TpSplit::Rows) t.shape[0] /= tp.size;
      if (t.split == TpSplit::Columns) t.shape[1] /= tp.size;
      t.numel = numel_of(t.shape);
      t.offset = total_;
      t.global_offset = global;
      t.decay = t.shape.size() >= 2;
      t.module = index;
      t.id = id++;
      global += numel_of(d.shape);
      total_ += t.numel;
      m.numel += t.numel;
      m.n_tensors++;
      tensors_.push_back(std::move(t));
    }
    next = index + 1;
    position_[index] = static_cast<int>(modules_.size());
    modules_.push_back(std::move(m));
  }
}

std::vector<DecaySegment> decay_segments(const ParamLayout& layout, size_t lo, size_t hi) {
  std::vector<DecaySegment> out;
  auto add = [&](size_t begin, size_t end, bool decay) {
    begin = std::max(begin, lo);
    end = std::min(end, hi);
    if (begin >= end) return;
    if (!out.empty() && out.back().decay == decay) {
      out.back().count += end - begin;
      return;
    }
    out.push_back({begin, end - begin, decay});
  };
  for (const TensorSpec& t : layout.tensors()) add(t.offset, t.offset + t.numel, t.decay);
  return out;
}

void check_tensor_parallel(const GPTConfig& c, int n) {
  const auto fail = [&](const char* what, int v) {
    throw Error(strf("parallel.tp_size = %d: %s (%d) does not split over %d tensor-parallel ranks", n, what, v, n),
                true);
  };
  if (c.n_head % n) fail("model.n_head", c.n_head);
  if ((4 * c.n_embd) % n) fail("the MLP width 4 x model.n_embd", 4 * c.n_embd);
  if (c.vocab_size % n) fail("model.vocab_size", c.vocab_size);
}

std::vector<ParamLayout::Run> ParamLayout::global_runs(size_t offset, size_t count) const {
  std::vector<Run> runs;
  const size_t end = offset + count;
  auto add = [&](size_t local, size_t global, size_t n) {  // clipped to [offset, end)
    const size_t lo = std::max(local, offset), hi = std::min(local + n, end);
    if (lo >= hi) return;
    if (!runs.empty() && runs.back().local + runs.back().count == lo &&
        runs.back().global + runs.back().count == global + (lo - local))
      runs.back().count += hi - lo;
    else
      runs.push_back({lo, global + (lo - local), hi - lo});
  };
  for (const TensorSpec& t : tensors_) {
    if (t.offset >= end || t.offset + t.numel <= offset) continue;
    const size_t g = t.global_offset, r = static_cast<size_t>(tp_.rank);
    if (t.split == TpSplit::Replicated) {
      add(t.offset, g, t.numel);
    } else if (t.split == TpSplit::Rows) {
      // Block b of the local rows is the rank's piece of block b of the whole rows (q, k, v each by heads).
      const size_t width = t.shape.size() == 2 ? static_cast<size_t>(t.shape[1]) : 1;
      const size_t block = static_cast<size_t>(t.shape[0]) / t.row_blocks * width;  // local elements per block
      for (int b = 0; b < t.row_blocks; b++)
        add(t.offset + b * block, g + (b * tp_.size + r) * block, block);
    } else {
      const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
      for (size_t i = 0; i < rows; i++) add(t.offset + i * cols, g + i * cols * tp_.size + r * cols, cols);
    }
  }
  return runs;
}

bool ParamLayout::has(int module) const {
  return module >= 0 && static_cast<size_t>(module) < position_.size() && position_[module] >= 0;
}

const ModuleSpec& ParamLayout::module(int index) const {
  YUAN_CHECK(has(index), "parameter layout: module %d (%s) is not held here", index,
             index >= 0 && index < module_count(cfg_) ? module_name(cfg_, index).c_str() : "no such module");
  return modules_[position_[index]];
}

const TensorSpec& ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw Error(strf("no parameter named '%s' in the GPT layout", name.c_str()));
}

static bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

void init_gpt2(const ParamLayout& layout, uint64_t seed, float* params, size_t offset, size_t count) {
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(layout.config().n_layer));
  const size_t end = count > layout.total() - std::min(offset, layout.total()) ? layout.total() : offset + count;
  std::vector<float> whole;
  for (const TensorSpec& t : layout.tensors()) {
    const size_t lo = std::max(t.offset, offset), hi = std::min(t.offset + t.numel, end);
    if (lo >= hi) continue;
    float* p = params + (lo - offset);
    if (t.shape.size() == 1) {  // LayerNorm gain 1, every bias (or a tensor-parallel part of one) 0
      std::fill(p, p + (hi - lo), t.split == TpSplit::Replicated && ends_with(t.name, ".weight") ? 1.0f : 0.0f);
      continue;
    }
    bool residual = ends_with(t.name, "attn.c_proj.weight") || ends_with(t.name, "mlp.c_proj.weight");
    // One stream per tensor of the whole model: adding a layer does not change the others' values, and a
    // pipeline stage, a tensor-parallel part or a shard gets the whole model's values of what it holds.
    Rng rng(seed, static_cast<uint64_t>(t.id));
    whole.resize(numel_of(t.full_shape));
    rng.fill_normal(whole.data(), whole.size(), residual ? residual_std : 0.02f);
    for (const ParamLayout::Run& run : layout.global_runs(lo, hi - lo))
      std::copy_n(whole.data() + (run.global - t.global_offset), run.count, params + (run.local - offset));
  }
}

void check_token_ids(const int32_t* ids, int rows, int stride, int vocab_size) {
  for (int r = 0; r < rows; r++)
    for (int t = 0; t < stride; t++) {
      int32_t id = ids[static_cast<size_t>(r) * stride + t];
      YUAN_CHECK(id >= 0 && id < vocab_size, "token id %d at row %d position %d outside the vocabulary [0, %d)", id, r,
                 t, vocab_size);
    }
}

double flops_per_token(const GPTConfig& c, size_t n_params) {
  double n = static_cast<double>(n_params) - static_cast<double>(c.seq_len) * c.n_embd;
  return 6.0 * n + 12.0 * c.n_layer * static_cast<double>(c.n_embd) * c.seq_len;
}

}  // namespace yuan
