#include "model/hf_gpt2.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json.h"
#include "util/safetensors.h"

namespace yuan {

namespace {

bool is_embedding(const TensorSpec& t) { return t.module == kWteModule || t.module == kWpeModule; }

// config.json's integer `key`, which must be present.
int config_int(const nlohmann::json& j, const char* key, const std::string& what) {
  return static_cast<int>(json_field<uint64_t>(j, key, what));
}

// Refuses `key` of config.json when present and not `want` (an absent key takes transformers' default, `want`).
template <class T>
void config_default(const nlohmann::json& j, const char* key, const T& want, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  YUAN_CHECK(*it == nlohmann::json(want), "%s: \"%s\" is %s, this model has %s only", what.c_str(), key,
             it->dump().c_str(), nlohmann::json(want).dump().c_str());
}

}  // namespace

std::string hf_gpt2_name(const TensorSpec& t) { return "transformer." + t.name; }

bool hf_gpt2_transposed(const TensorSpec& t) { return t.full_shape.size() == 2 && !is_embedding(t); }

void hf_gpt2_transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
}

std::string hf_gpt2_config(const GPTConfig& c, int eot_id) {
  nlohmann::ordered_json j = {{"model_type", "gpt2"},
                              {"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
                              {"vocab_size", c.vocab_size},
                              {"n_positions", c.seq_len},
                              {"n_ctx", c.seq_len},
                              {"n_embd", c.n_embd},
                              {"n_layer", c.n_layer},
                              {"n_head", c.n_head},
                              {"n_inner", nullptr},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", 1e-5},
                              {"tie_word_embeddings", true},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"attn_pdrop", 0.0},
                              {"scale_attn_weights", true},
                              {"initializer_range", 0.02}};
  if (eot_id >= 0) {
    j["bos_token_id"] = eot_id;
    j["eos_token_id"] = eot_id;
  }
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

HfGpt2Weights::HfGpt2Weights(const std::string& dir, const GPTConfig& deck) : layout_(deck) {
  const std::string config = dir + "/config.json";
  const std::string what = "init.from " + config;
  const nlohmann::json j = read_json_object(config, what);
  config_default(j, "model_type", std::string("gpt2"), what);
  const struct {
    const char* key;
    int deck;
    const char* deck_key;
  } same[] = {{"n_layer", deck.n_layer, "model.n_layer"},
              {"n_head", deck.n_head, "model.n_head"},
              {"n_embd", deck.n_embd, "model.n_embd"}};
  for (const auto& s : same) {
    const int v = config_int(j, s.key, what);
    YUAN_CHECK(v == s.deck, "%s: \"%s\" is %d, the deck's %s %d", what.c_str(), s.key, v, s.deck_key, s.deck);
  }
  config_default(j, "n_inner", 4 * deck.n_embd, what);
  const auto act = j.find("activation_function");
  YUAN_CHECK(act == j.end() || *act == "gelu_new" || *act == "gelu_pytorch_tanh",
             "%s: \"activation_function\" is %s, this model has GELU's tanh form (gelu_new) only", what.c_str(),
             act->dump().c_str());
  config_default(j, "layer_norm_epsilon", 1e-5, what);
  config_default(j, "tie_word_embeddings", true, what);
  config_default(j, "scale_attn_weights", true, what);
  config_default(j, "scale_attn_by_inverse_layer_idx", false, what);
  hf_vocab_ = config_int(j, "vocab_size", what);
  hf_positions_ = config_int(j, "n_positions", what);
  YUAN_CHECK(hf_vocab_ <= deck.vocab_size, "%s: \"vocab_size\" is %d, more than the deck's model.vocab_size %d",
             what.c_str(), hf_vocab_, deck.vocab_size);
  YUAN_CHECK(hf_positions_ >= deck.seq_len, "%s: \"n_positions\" is %d, fewer than the deck's model.seq_len %d",
             what.c_str(), hf_positions_, deck.seq_len);

  file_ = std::make_unique<SafetensorsReader>(dir + "/model.safetensors");
  prefix_ = file_->has(hf_gpt2_name(layout_.wte())) ? "transformer." : "";
  for (const TensorSpec& t : layout_.tensors())
    YUAN_CHECK(file_->has(prefix_ + t.name), "init.from %s: no tensor %s%s (nor %s)", file_->path().c_str(),
               prefix_.c_str(), t.name.c_str(), prefix_.empty() ? hf_gpt2_name(t).c_str() : t.name.c_str());
  // A classifier of its own would be an untied model, which this one is not: only a copy of wte is accepted.
  if (file_->has("lm_head.weight")) {
    const std::vector<int64_t> shape = {hf_vocab_, deck.n_embd};
    YUAN_CHECK(file_->read_f32("lm_head.weight", shape) == file_->read_f32(prefix_ + "wte.weight", shape),
               "init.from %s: lm_head.weight differs from wte.weight: an untied classifier, which this model does "
               "not have", file_->path().c_str());
  }
}

HfGpt2Weights::~HfGpt2Weights() = default;

void HfGpt2Weights::convert(const TensorSpec& t) const {
  const int64_t rows = t.full_shape[0], cols = t.full_shape.size() == 2 ? t.full_shape[1] : 1;
  whole_.assign(static_cast<size_t>(rows * cols), 0.0f);
  const std::string name = prefix_ + t.name;
  if (is_embedding(t)) {
    // Rows past the file's vocabulary stay zero (the deck's padding); positions past seq_len are not used.
    const int64_t have = t.module == kWteModule ? hf_vocab_ : hf_positions_;
    const std::vector<float> v = file_->read_f32(name, {have, cols});
    std::copy_n(v.begin(), std::min(have, rows) * cols, whole_.begin());
  } else if (hf_gpt2_transposed(t)) {
    hf_gpt2_transpose(file_->read_f32(name, {cols, rows}).data(), cols, rows, whole_.data());  // from [in, out]
  } else {
    file_->read_f32(name, t.full_shape, whole_.data());
  }
  converted_ = t.id;
}

void HfGpt2Weights::read(size_t global, size_t count, float* dst) const {
  const size_t end = global + count;
  YUAN_CHECK(end <= layout_.total(), "HfGpt2Weights::read past the model's %zu values", layout_.total());
  for (const TensorSpec& t : layout_.tensors()) {
    const size_t lo = std::max(t.offset, global), hi = std::min(t.offset + t.numel, end);
    if (lo >= hi) continue;
    if (converted_ != t.id) convert(t);
    std::copy(whole_.begin() + (lo - t.offset), whole_.begin() + (hi - t.offset), dst + (lo - global));
  }
}

}  // namespace yuan
