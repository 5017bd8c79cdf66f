#include "model/gpt.h"

#include <cmath>

#include "util/error.h"
#include "util/rng.h"

namespace yuan {

ParamLayout::ParamLayout(const GPTConfig& c) : cfg_(c) {
  const int64_t C = c.n_embd, V = c.vocab_size, T = c.seq_len;
  auto begin_module = [&](const std::string& name) {
    ModuleSpec m;
    m.name = name;
    m.offset = total_;
    m.first_tensor = static_cast<int>(tensors_.size());
    modules_.push_back(m);
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorSpec t;
    t.name = name;
    t.shape = std::move(shape);
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
    t.offset = total_;
    t.decay = t.shape.size() >= 2;
    t.module = static_cast<int>(modules_.size()) - 1;
    total_ += t.numel;
    tensors_.push_back(t);
    ModuleSpec& m = modules_.back();
    m.numel += t.numel;
    m.n_tensors++;
  };
  begin_module("wte");
  add("wte.weight", {V, C});
  begin_module("wpe");
  add("wpe.weight", {T, C});
  for (int l = 0; l < c.n_layer; l++) {
    std::string p = "h." + std::to_string(l);
    begin_module(p);
    add(p + ".ln_1.weight", {C});
    add(p + ".ln_1.bias", {C});
    add(p + ".attn.c_attn.weight", {3 * C, C});
    add(p + ".attn.c_attn.bias", {3 * C});
    add(p + ".attn.c_proj.weight", {C, C});
    add(p + ".attn.c_proj.bias", {C});
    add(p + ".ln_2.weight", {C});
    add(p + ".ln_2.bias", {C});
    add(p + ".mlp.c_fc.weight", {4 * C, C});
    add(p + ".mlp.c_fc.bias", {4 * C});
    add(p + ".mlp.c_proj.weight", {C, 4 * C});
    add(p + ".mlp.c_proj.bias", {C});
  }
  begin_module("ln_f");
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
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
  for (size_t i = 0; i < layout.tensors().size(); i++) {
    const TensorSpec& t = layout.tensors()[i];
    float* p = params + t.offset;
    if (t.shape.size() == 1) {
      float v = ends_with(t.name, ".weight") ? 1.0f : 0.0f;  // LayerNorm gain 1, every bias 0
      for (size_t j = 0; j < t.numel; j++) p[j] = v;
      continue;
    }
    bool residual = ends_with(t.name, "attn.c_proj.weight") || ends_with(t.name, "mlp.c_proj.weight");
    // One stream per tensor: adding a layer does not change the others' values.
    Rng rng(seed, i);
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
