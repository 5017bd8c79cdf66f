#include "train/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "parallel/world.h"
#include "model/gpt.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/safetensors.h"
#include "util/sha256.h"

namespace yuan {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;  // what is written keeps its keys in the order they are given

namespace {

constexpr const char* kFormat = "yuanlm-checkpoint-1";

std::string step_name(int64_t step) { return strf("step_%07lld", static_cast<long long>(step)); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  YUAN_CHECK(in, "cannot read '%s'", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One optimizer shard: `count` values, the pieces of the model as tensor rank tp_rank of tp_size holds it one after
// the other (ZeroOptimizer::shard_pieces; the whole model's flat buffer at tp_size 1). state.json gives one piece as
// "offset", several (ZeRO-3: one per module) as "pieces": [[offset, count], ...].
struct ShardFile {
  std::string name;
  size_t count = 0;
  std::vector<ShardPiece> pieces;
  int tp_rank = 0, tp_size = 1;
};

struct State {
  TrainState train;
  int64_t adam_step = 0;
  int world = 0;
  size_t n_params = 0;
  std::string tokenizer;
  std::vector<ShardFile> shards;
  std::vector<std::pair<std::string, std::string>> checksums;  // file, sha256
};

// The JSON object in `path`; `what` names it in errors ("checkpoint DIR: state.json").
json read_json_object(const std::string& path, const std::string& what) {
  json j;
  try {
    j = json::parse(read_text(path));
  } catch (const json::parse_error& e) {
    throw Error(strf("%s: unreadable: %s", what.c_str(), e.what()));
  }
  YUAN_CHECK(j.is_object(), "%s: not a JSON object", what.c_str());
  return j;
}

// A member of a JSON object that must be present and of the type T (integers non-negative).
template <typename T>
T field(const json& obj, const char* key, const std::string& what) {
  const auto it = obj.find(key);
  YUAN_CHECK(it != obj.end(), "%s: no \"%s\"", what.c_str(), key);
  const bool ok = std::is_same_v<T, std::string> ? it->is_string() : it->is_number_unsigned();
  YUAN_CHECK(ok, "%s: \"%s\" is not a %s", what.c_str(), key,
             std::is_same_v<T, std::string> ? "string" : "non-negative integer");
  return it->get<T>();
}

State read_state(const std::string& dir) {
  const std::string what = "checkpoint " + dir + ": state.json";
  const json t = read_json_object(dir + "/state.json", what);
  State s;
  YUAN_CHECK(field<std::string>(t, "format", what) == kFormat, "checkpoint %s: state.json format is not %s",
             dir.c_str(), kFormat);
  s.train.step = field<int64_t>(t, "step", what);
  s.train.next_sample = field<uint64_t>(t, "next_sample", what);
  s.adam_step = field<int64_t>(t, "adam_step", what);
  s.world = field<int>(t, "world", what);
  s.n_params = field<size_t>(t, "n_params", what);
  if (t.contains("tokenizer")) s.tokenizer = field<std::string>(t, "tokenizer", what);
  const auto files = t.find("files");
  YUAN_CHECK(files != t.end() && files->is_array(), "%s: no \"files\" list", what.c_str());
  for (const json& f : *files) {
    YUAN_CHECK(f.is_object(), "%s: a \"files\" entry is not an object", what.c_str());
    const std::string name = field<std::string>(f, "name", what);
    const std::string entry = what + ": file '" + name + "'";
    s.checksums.emplace_back(name, field<std::string>(f, "sha256", entry));
    if (f.contains("offset") || f.contains("pieces")) {
      ShardFile shard{name, field<size_t>(f, "count", entry), {}};
      if (f.contains("offset")) {
        shard.pieces.push_back({field<size_t>(f, "offset", entry), shard.count});
      } else {
        size_t total = 0;
        for (const json& p : f["pieces"]) {
          YUAN_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_unsigned() && p[1].is_number_unsigned(),
                     "%s: \"pieces\" must be a list of [offset, count] pairs", entry.c_str());
          shard.pieces.push_back({p[0].get<size_t>(), p[1].get<size_t>()});
          total += shard.pieces.back().count;
        }
        YUAN_CHECK(total == shard.count, "%s: its pieces hold %zu values, \"count\" says %zu", entry.c_str(), total,
                   shard.count);
      }
      if (f.contains("tp_size")) {
        shard.tp_rank = field<int>(f, "tp_rank", entry);
        shard.tp_size = field<int>(f, "tp_size", entry);
      }
      s.shards.push_back(shard);
    }
  }
  YUAN_CHECK(!s.shards.empty(), "checkpoint %s: state.json lists no optimizer shards", dir.c_str());
  return s;
}

// Fills dst with tensor `name` ("master", "exp_avg", "exp_avg_sq") of the runs `want` of the whole model's flat
// buffer (Run::local indexes dst), out of the shard files that cover them, whatever tensor-parallel layout wrote
// them. Values past the parameters (the padding of older checkpoints) are never read.
void read_runs(const std::string& dir, const State& s, const GPTConfig& model, const char* name,
               const std::vector<ParamLayout::Run>& want, float* dst) {
  std::map<std::pair<int, int>, ParamLayout> layouts;  // the model as each tensor rank held it
  for (const ShardFile& f : s.shards) {
    auto it = layouts.find({f.tp_rank, f.tp_size});
    if (it == layouts.end())
      it = layouts.emplace(std::pair{f.tp_rank, f.tp_size},
                           ParamLayout(model, held_modules(model, all_modules(model)), {f.tp_rank, f.tp_size}))
               .first;
    // Where each value of the file belongs in the whole model (Run::local: its position in the file).
    std::vector<ParamLayout::Run> have;
    size_t pos = 0;
    for (const ShardPiece& p : f.pieces) {
      const size_t total = it->second.total();
      const size_t count = std::min(p.count, total - std::min(p.model_offset, total));
      for (ParamLayout::Run run : it->second.global_runs(p.model_offset, count)) {
        run.local = run.local - p.model_offset + pos;
        have.push_back(run);
      }
      pos += p.count;
    }
    std::optional<SafetensorsReader> r;
    for (const ParamLayout::Run& h : have)
      for (const ParamLayout::Run& w : want) {
        const size_t lo = std::max(h.global, w.global), hi = std::min(h.global + h.count, w.global + w.count);
        if (lo >= hi) continue;
        if (!r) {
          r.emplace(dir + "/" + f.name);
          const SafeTensorInfo& info = r->info(name);
          YUAN_CHECK(info.dtype == "F32" && info.numel() == f.count, "checkpoint %s/%s: tensor '%s' is not F32[%zu]",
                     dir.c_str(), f.name.c_str(), name, f.count);
        }
        const float* src = reinterpret_cast<const float*>(r->raw(name)) + h.local;
        std::memcpy(dst + w.local + (lo - w.global), src + (lo - h.global), (hi - lo) * sizeof(float));
      }
  }
}

bool verify(const std::string& dir, int rank, int world, std::string* why) {
  try {
    State s = read_state(dir);
    for (size_t i = 0; i < s.checksums.size(); i++) {
      if (static_cast<int>(i % world) != rank) continue;  // each rank hashes its share of the files
      const auto& [file, sum] = s.checksums[i];
      std::string path = dir + "/" + file;
      YUAN_CHECK(fs::exists(path), "%s is missing", path.c_str());
      YUAN_CHECK(sha256_file(path) == sum, "%s does not match its checksum", path.c_str());
    }
    return true;
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
}

bool same_model(const GPTConfig& a, const GPTConfig& b) {
  return a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_embd == b.n_embd && a.seq_len == b.seq_len &&
         a.vocab_size == b.vocab_size;
}

Config read_config(const std::string& dir) {
  Config c;
  parse_config({dir + "/config.ini"}, "train", c);
  return c;
}

}  // namespace

std::string save_checkpoint(const Config& cfg, const TrainState& st, ZeroOptimizers& opts,
                            const std::string& tokenizer_file) {
  const parallel::WorldInfo& w = parallel::world();
  const std::string root = cfg.run.dir + "/ckpt", name = step_name(st.step);
  const std::string final_dir = root + "/" + name, tmp = root + "/.tmp_" + name;
  if (w.rank == 0) {
    make_dirs(root);
    fs::remove_all(tmp);
    make_dirs(tmp);
  }
  parallel::barrier();

  // One file per optimizer shard, named by rank and first module; zero 0 keeps a group's whole state on every
  // member, so its rank 0 writes it once.
  ordered_json mine = ordered_json::array();
  for (const auto& opt : opts.all()) {
    if (opt->stage() == 0 && opt->group_rank() != 0) continue;
    std::string file = strf("optim_%05d_%03d.safetensors", w.rank, opt->modules().first);
    const std::vector<int64_t> shape = {static_cast<int64_t>(opt->shard_size())};
    SafetensorsWriter out;
    out.add_f32("master", shape, opt->master());
    out.add_f32("exp_avg", shape, opt->exp_avg());
    out.add_f32("exp_avg_sq", shape, opt->exp_avg_sq());
    out.write(tmp + "/" + file);
    ordered_json entry = {{"name", file}};
    const std::vector<ShardPiece> pieces = opt->shard_pieces();
    if (pieces.size() == 1) {
      entry["offset"] = pieces[0].model_offset;
    } else {
      entry["pieces"] = ordered_json::array();
      for (const ShardPiece& p : pieces) entry["pieces"].push_back({p.model_offset, p.count});
    }
    entry["count"] = opt->shard_size();
    const TensorParallel& tp = opt->tensor_parallel();
    if (tp.size > 1) entry["tp_rank"] = tp.rank, entry["tp_size"] = tp.size;
    entry["sha256"] = sha256_file(tmp + "/" + file);
    mine.push_back(std::move(entry));
  }
  // Each rank's files entries travel as JSON text; rank 0 assembles state.json.
  const std::vector<std::string> entries = parallel::gather_strings(mine.dump());
  if (w.rank == 0) {
    ordered_json files = ordered_json::array();
    for (const std::string& e : entries)
      for (ordered_json& f : ordered_json::parse(e)) files.push_back(std::move(f));
    write_file_atomic(tmp + "/config.ini", cfg.to_ini());
    files.push_back({{"name", "config.ini"}, {"sha256", sha256_file(tmp + "/config.ini")}});
    std::string tok;
    if (!tokenizer_file.empty()) {
      tok = "tokenizer" + fs::path(tokenizer_file).extension().string();
      fs::copy_file(tokenizer_file, tmp + "/" + tok, fs::copy_options::overwrite_existing);
      files.push_back({{"name", tok}, {"sha256", sha256_file(tmp + "/" + tok)}});
    }
    const ordered_json state = {{"format", kFormat},
                                {"step", st.step},
                                {"next_sample", st.next_sample},
                                {"adam_step", opts.all().front()->adam_step()},
                                {"world", w.size},
                                {"zero", opts.stage()},
                                {"n_params", ParamLayout(cfg.model).total()},
                                {"tokenizer", tok},
                                {"files", files}};
    write_file_atomic(tmp + "/state.json", state.dump(2) + "\n");
    sync_dir(tmp);
    fs::remove_all(final_dir);  // a checkpoint of the same step from before a crash is superseded
    fs::rename(tmp, final_dir);
    sync_dir(root);
    write_file_atomic(root + "/latest", name + "\n");
    // keep the newest ckpt.keep
    std::vector<std::string> steps;
    for (const auto& e : fs::directory_iterator(root))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
        steps.push_back(e.path().filename().string());
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + cfg.ckpt.keep < steps.size(); i++) fs::remove_all(root + "/" + steps[i]);
  }
  parallel::barrier();
  return final_dir;
}

std::string find_resumable_checkpoint(const std::string& run_dir) {
  const parallel::WorldInfo& w = parallel::world();
  const std::string root = run_dir + "/ckpt";
  std::vector<std::string> steps;
  if (fs::is_directory(root))
    for (const auto& e : fs::directory_iterator(root))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
        steps.push_back(e.path().filename().string());
  std::sort(steps.rbegin(), steps.rend());
  // Ranks may see different directory listings on a lagging filesystem: rank 0's list decides.
  std::string joined;
  for (const auto& s : steps) joined += s + "\n";
  joined = parallel::broadcast_string(joined, 0);
  std::istringstream in(joined);
  for (std::string s; std::getline(in, s);) {
    std::string dir = root + "/" + s, why;
    bool ok = verify(dir, w.rank, w.size, &why);
    bool all_ok = parallel::allreduce_max(ok ? 0.0 : 1.0) == 0.0;
    if (all_ok) return dir;
    if (!ok) say_all("warning: skipping checkpoint %s: %s", dir.c_str(), why.c_str());
  }
  return "";
}

TrainState load_checkpoint(const std::string& dir, const Config& cfg, ZeroOptimizers& opts) {
  State s = read_state(dir);
  Config saved = read_config(dir);
  YUAN_CHECK(same_model(saved.model, cfg.model),
             "checkpoint %s was written for a different model (its config.ini: n_layer %d, n_head %d, n_embd %d, "
             "seq_len %d, vocab_size %d)",
             dir.c_str(), saved.model.n_layer, saved.model.n_head, saved.model.n_embd, saved.model.seq_len,
             saved.model.vocab_size);
  YUAN_CHECK(s.n_params == ParamLayout(cfg.model).total(), "checkpoint %s: %zu parameters, the model has %zu",
             dir.c_str(), s.n_params, ParamLayout(cfg.model).total());
  for (const auto& opt : opts.all()) {
    // The shard's place in the whole model: pieces of tensors when it is a tensor rank's part.
    const ParamLayout mine(cfg.model, held_modules(cfg.model, all_modules(cfg.model)), opt->tensor_parallel());
    std::vector<ParamLayout::Run> want;
    size_t pos = 0;
    for (const ShardPiece& p : opt->shard_pieces()) {
      for (ParamLayout::Run run : mine.global_runs(p.model_offset, p.count)) {
        run.local = run.local - p.model_offset + pos;
        want.push_back(run);
      }
      pos += p.count;
    }
    read_runs(dir, s, cfg.model, "master", want, opt->master());
    read_runs(dir, s, cfg.model, "exp_avg", want, opt->exp_avg());
    read_runs(dir, s, cfg.model, "exp_avg_sq", want, opt->exp_avg_sq());
    opt->set_adam_step(s.adam_step);
    opt->load_backend_params();
  }
  say("resumed from %s: step %lld, written by %d ranks%s", dir.c_str(), static_cast<long long>(s.train.step), s.world,
      s.world != parallel::world().size ? strf(", optimizer state re-cut for %d", parallel::world().size).c_str() : "");
  return s.train;
}

CheckpointModel load_checkpoint_model(const std::string& path) {
  CheckpointModel m;
  m.dir = path;
  if (!fs::exists(path + "/state.json")) {
    std::string latest = path + "/ckpt/latest";
    YUAN_CHECK(fs::exists(latest), "'%s' is neither a checkpoint (no state.json) nor a run directory (no ckpt/latest)",
               path.c_str());
    std::string name = read_text(latest);
    name.erase(name.find_last_not_of(" \n") + 1);
    m.dir = path + "/ckpt/" + name;
  }
  State s = read_state(m.dir);
  m.cfg = read_config(m.dir);
  m.step = s.train.step;
  m.world = s.world;
  YUAN_CHECK(s.n_params == ParamLayout(m.cfg.model).total(),
             "checkpoint %s: %zu parameters in state.json, config.ini describes %zu", m.dir.c_str(), s.n_params,
             ParamLayout(m.cfg.model).total());
  allocating(s.n_params * sizeof(float), "the checkpoint's weights", [&] { m.weights.resize(s.n_params); });
  read_runs(m.dir, s, m.cfg.model, "master", {{0, 0, s.n_params}}, m.weights.data());
  if (!s.tokenizer.empty()) m.tokenizer = m.dir + "/" + s.tokenizer;
  return m;
}

std::string find_tokenizer_for(const std::string& train_glob) {
  const std::vector<std::string> shards = expand_glob(train_glob);
  if (shards.empty()) return "";
  const fs::path dir = fs::path(shards[0]).parent_path();
  const fs::path manifest = dir / "manifest.json";
  if (!fs::exists(manifest)) return "";
  const json t = read_json_object(manifest.string(), manifest.string());
  const std::string file = t.contains("tokenizer_file") ? field<std::string>(t, "tokenizer_file", manifest) : "";
  if (file.empty()) return "";
  fs::path p = fs::path(file).is_absolute() ? fs::path(file) : dir / file;
  YUAN_CHECK(fs::exists(p), "%s names tokenizer '%s', which does not exist", manifest.c_str(), p.c_str());
  const std::string name = t.contains("tokenizer") ? field<std::string>(t, "tokenizer", manifest) : "";
  const std::string sum = sha256_file(p.string());
  YUAN_CHECK(name.size() >= sum.size() && name.compare(name.size() - sum.size(), sum.size(), sum) == 0,
             "%s: tokenizer '%s' has sha256 %s, the manifest says '%s'", manifest.c_str(), p.c_str(), sum.c_str(),
             name.c_str());
  return p.string();
}

}  // namespace yuan
