// `yuanlm export`: a checkpoint as a HuggingFace GPT-2 directory that GPT2LMHeadModel.from_pretrained loads
// unchanged. The architectures are the same (learned positions, pre-LayerNorm, GELU tanh = "gelu_new",
// LayerNorm eps 1e-5, tied classifier), so export is renaming plus one transpose: HF's GPT-2 keeps its
// matrices in Conv1D layout [in, out] (y = x @ W + b), ours are nn.Linear's [out, in]. The embeddings are
// [rows, n_embd] in both. lm_head.weight is not written: HF ties it to transformer.wte.weight, as GPT-2's own
// checkpoints do.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "prep/tokenizer.h"
#include "run/commands.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/safetensors.h"

namespace yuan {

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

// The name HF's tokenizers look for: SentencePiece models as tokenizer.model, WordPiece vocabularies
// (BertTokenizer) as vocab.txt.
std::string hf_tokenizer_name(const std::string& path) {
  return fs::path(path).extension() == ".model" ? "tokenizer.model" : "vocab.txt";
}

std::string hf_config(const GPTConfig& c, int eot_id) {
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

}  // namespace

int export_main(const std::vector<std::string>& args) {
  std::string checkpoint, out;
  po::options_description desc(
      "yuanlm export: a checkpoint as a HuggingFace GPT-2 directory (model.safetensors, config.json, tokenizer)\n\n"
      "usage: yuanlm export --checkpoint DIR --out DIR\n\noptions", kHelpWidth);
  desc.add_options()
      ("help,h", "print this help")
      ("checkpoint", po::value(&checkpoint)->required(),
       "a checkpoint directory (run/ckpt/step_N) or a run directory (its newest checkpoint)")
      ("out", po::value(&out)->required(), "output directory (created; files of the same name are replaced)");
  if (!parse_command("export", args, desc)) return 0;

  const CheckpointModel m = load_checkpoint_model(checkpoint);
  if (process_rank() != 0) return 0;  // under mpirun, one writer
  make_dirs(out);
  const ParamLayout layout(m.cfg.model);
  SafetensorsWriter st;
  std::vector<std::vector<float>> transposed;
  transposed.reserve(layout.tensors().size());  // the writer keeps pointers into these
  for (const TensorSpec& t : layout.tensors()) {
    const float* src = m.weights.data() + t.offset;
    const std::string name = "transformer." + t.name;
    if (t.shape.size() != 2 || t.name == "wte.weight" || t.name == "wpe.weight") {
      st.add_f32(name, t.shape, src);
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];  // [out, in]
    std::vector<float>& dst = transposed.emplace_back(t.numel);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
    st.add_f32(name, {cols, rows}, dst.data());
  }
  st.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  st.write(out + "/model.safetensors");

  int eot = -1;
  std::string tok_file;
  if (!m.tokenizer.empty()) {
    eot = load_tokenizer(m.tokenizer)->eot_id();
    tok_file = hf_tokenizer_name(m.tokenizer);
    fs::copy_file(m.tokenizer, out + "/" + tok_file, fs::copy_options::overwrite_existing);
  }
  write_file_atomic(out + "/config.json", hf_config(m.cfg.model, eot));
  say("export %s (step %lld) -> %s: model.safetensors (%zu parameters, fp32), config.json%s", m.dir.c_str(),
      static_cast<long long>(m.step), out.c_str(), layout.total(),
      tok_file.empty() ? ", no tokenizer (the run's shards had no manifest.json)" : (", " + tok_file).c_str());
  return 0;
}

}  // namespace yuan
