#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/error.h"
#include "util/rng.h"

namespace yuan {

namespace {

// The tensors of one module, as (name suffix, shape) in table order.
std::vector<std::pair<std::string, std::vector<int64_t>>> module_tensors(const GPTConfig& c, int module) {
  const int64_t C = c.n_embd, V = c.vocab_size, T = c.seq_len;
  if (module == kWteModule) return {{"weight", {V, C}}};
  if (module == kWpeModule) return {{"weight", {T, C}}};
  if (module == ln_f_module(c)) return {{"weight", {C}}, {"bias", {C}}};
  return {{"ln_1.weight", {C}},          {"ln_1.bias", {C}},           {"attn.c_attn.weight", {3 * C, C}},
          {"attn.c_attn.bias", {3 * C}}, {"attn.c_proj.weight", {C, C}}, {"attn.c_proj.bias", {C}},
          {"ln_2.weight", {C}},          {"ln_2.bias", {C}},           {"mlp.c_fc.weight", {4 * C, C}},
          {"mlp.c_fc.bias", {4 * C}},    {"mlp.c_proj.weight", {C, 4 * C}}, {"mlp.c_proj.bias", {C}}};
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

ParamLayout::ParamLayout(const GPTConfig& c, const std::vector<int>& modules)
    : cfg_(c), position_(static_cast<size_t>(std::max(module_count(c), 0)), -1) {
  int id = 0, next = 0;  // id of the first tensor of module `next`
  for (int index : modules) {
    YUAN_CHECK(index >= 0 && index < module_count(c) && position_[index] < 0 && (modules_.empty() ||
               index > modules_.back().index), "parameter layout: module %d out of order, repeated or outside the "
               "%d modules of the model", index, module_count(c));
    for (; next < index; next++) id += static_cast<int>(module_tensors(c, next).size());
    ModuleSpec m;
    m.name = module_name(c, index);
    m.index = index;
    m.offset = total_;
    m.first_tensor = static_cast<int>(tensors_.size());
    for (auto& [suffix, shape] : module_tensors(c, index)) {
      TensorSpec t;
      t.name = m.name + "." + suffix;
      t.shape = shape;
      t.numel = 1;
      for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
      t.offset = total_;
      t.decay = t.shape.size() >= 2;
      t.module = index;
      t.id = id++;
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

void init_gpt2(const ParamLayout& layout, uint64_t seed, float* params) {
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(layout.config().n_layer));
  for (const TensorSpec& t : layout.tensors()) {
    float* p = params + t.offset;
    if (t.shape.size() == 1) {
      float v = ends_with(t.name, ".weight") ? 1.0f : 0.0f;  // LayerNorm gain 1, every bias 0
      for (size_t j = 0; j < t.numel; j++) p[j] = v;
      continue;
    }
    bool residual = ends_with(t.name, "attn.c_proj.weight") || ends_with(t.name, "mlp.c_proj.weight");
    // One stream per tensor of the whole model: adding a layer does not change the others' values, and a
    // pipeline stage initialises its modules as the whole model would.
    Rng rng(seed, static_cast<uint64_t>(t.id));
    rng.fill_normal(p, t.numel, residual ? residual_std : 0.02f);
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
