// `yuanlm export`: a checkpoint as a HuggingFace GPT-2 directory that GPT2LMHeadModel.from_pretrained loads
// unchanged. The architectures are the same (learned positions, pre-LayerNorm, GELU tanh = "gelu_new",
// LayerNorm eps 1e-5, tied classifier), so export is renaming plus one transpose: HF's GPT-2 keeps its
// matrices in Conv1D layout [in, out] (y = x @ W + b), ours are nn.Linear's [out, in]. The embeddings are
// [rows, n_embd] in both. lm_head.weight is not written: HF ties it to transformer.wte.weight, as GPT-2's own
// checkpoints do.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

bool is_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "state.json", ec);
}

// Refuses an output directory that is a checkpoint, lies inside one, or holds checkpoints (a run directory, its
// ckpt/): files written there would sit among the checkpoint's own, and a failure half-way would leave them there.
void refuse_checkpoint_output(const std::string& out) {
  const fs::path target = fs::weakly_canonical(fs::absolute(out));
  for (fs::path p = target;; p = p.parent_path()) {
    YUAN_CHECK(!is_checkpoint(p), "export: --out %s is %s checkpoint %s; give a directory outside it", out.c_str(),
               p == target ? "the" : "inside the", p.c_str());
    if (p == p.root_path() || p.empty()) break;
  }
  std::error_code ec;
  if (!fs::is_directory(target, ec)) return;
  for (const fs::path& dir : {target, target / "ckpt"})
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
      YUAN_CHECK(!e.is_directory(ec) || !is_checkpoint(e.path()),
                 "export: --out %s holds the checkpoint %s; give a directory outside the run", out.c_str(),
                 e.path().c_str());
}

// The export's files are written into a directory of this export's own beside `out` and moved into place only once
// all are written, so a failed export leaves `out` as it was and two exports into one `out` never share a directory;
// it goes away with this object, whatever happened. Its name, ".NAME.export-PID@HOST", lets a later export remove it
// when the process that made it was killed.
class StagingDir {
 public:
  explicit StagingDir(const std::string& out) : out_(out) {
    target_ = fs::absolute(out).lexically_normal();
    if (!target_.has_filename()) target_ = target_.parent_path();  // "hf/tiny/"
    std::error_code ec;
    const fs::file_status st = fs::status(target_, ec);
    YUAN_CHECK(!fs::exists(st) || fs::is_directory(st), "export: --out %s is not a directory", out.c_str());
    existed_ = fs::exists(st);
    const fs::path parent = target_.parent_path();
    make_dirs(parent.string());
    remove_orphans();
    path_ = parent / staging_dir_name(target_.filename().string(), "export", process_host());
    fs::remove_all(path_, ec);  // our own pid: left by a killed export that had it
    YUAN_CHECK(::mkdir(path_.c_str(), 0755) == 0, "export: --out %s: cannot create %s: %s", out.c_str(),
               path_.c_str(), std::strerror(errno));
  }
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }

  // A new `out` is the staging directory renamed, in one step; an existing one gets each file renamed into it
  // (other files there stay).
  void commit() {
    sync_dir(path_.string());
    if (!existed_) {
      if (std::rename(path_.c_str(), target_.c_str()) == 0) {
        sync_dir(target_.parent_path().string());
        return;
      }
      // rename(2) does not replace a directory that is not empty: another export into `out` finished first. Moving
      // these files into its directory could leave one holding files of two exports.
      const int e = errno;
      YUAN_CHECK(e != EEXIST && e != ENOTEMPTY, "export: --out %s appeared while this export was writing (another "
                 "export into it?); it is left as it is: export again to replace its files", out_.c_str());
      throw Error(strf("export: cannot move %s to --out %s: %s", path_.c_str(), out_.c_str(), std::strerror(e)));
    }
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(path_, ec))
      YUAN_CHECK(std::rename(e.path().c_str(), (target_ / e.path().filename()).c_str()) == 0,
                 "export: cannot move %s into --out %s: %s", e.path().c_str(), out_.c_str(), std::strerror(errno));
    YUAN_CHECK(!ec, "export: cannot list %s: %s", path_.c_str(), ec.message().c_str());
    sync_dir(target_.string());
  }

 private:
  // A pid says nothing about another host's processes: only this host's directories of exports gone are removed.
  void remove_orphans() const {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(target_.parent_path(), ec)) {
      const std::optional<StagingDirName> s =
          parse_staging_dir_name(e.path().filename().string(), target_.filename().string());
      if (!s || s->kind != "export") continue;
      if (!staging_owner_gone(*s, process_host())) continue;  // that export still runs, or ran on another host
      std::error_code removed;
      fs::remove_all(e.path(), removed);
    }
  }

  std::string out_;
  fs::path target_, path_;
  bool existed_ = false;
};

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
      ("out", po::value(&out)->required(),
       "output directory, outside the checkpoints (created; files of the same name are replaced, all at the end: "
       "a failed export leaves it as it was)");
  if (!parse_command("export", args, desc)) return 0;
  refuse_checkpoint_output(out);

  const CheckpointModel m = load_checkpoint_model(checkpoint);
  if (process_rank() != 0) return 0;  // under mpirun, one writer
  StagingDir staging(out);
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
  st.write(staging.file("model.safetensors"));

  int eot = -1;
  std::string tok_file;
  if (!m.tokenizer.empty()) {
    eot = load_tokenizer(m.tokenizer)->eot_id();
    tok_file = hf_tokenizer_name(m.tokenizer);
    std::error_code ec;
    fs::copy_file(m.tokenizer, staging.file(tok_file), ec);
    YUAN_CHECK(!ec, "export: cannot copy the tokenizer %s: %s", m.tokenizer.c_str(), ec.message().c_str());
  }
  write_file_atomic(staging.file("config.json"), hf_config(m.cfg.model, eot));
  staging.commit();
  say("export %s (step %lld) -> %s: model.safetensors (%zu parameters, fp32), config.json%s", m.dir.c_str(),
      static_cast<long long>(m.step), out.c_str(), layout.total(),
      tok_file.empty() ? ", no tokenizer (the run's shards had no manifest.json)" : (", " + tok_file).c_str());
  return 0;
}

}  // namespace yuan
