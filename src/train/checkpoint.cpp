#include "train/checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "comm/world.h"
#include "data/shard.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"
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

struct State {
  TrainState train;
  int64_t adam_step = 0;
  int world = 0;
  size_t n_params = 0;
  std::string tokenizer, tokenizer_sha256;
  std::vector<ShardFile> shards;
  std::vector<std::pair<std::string, std::string>> checksums;  // file, sha256
  bool sealed = false;  // state.json carries its own sha256 (older checkpoints do not)
};

Config read_config(const std::string& dir) {
  Config c;
  parse_config({dir + "/config.ini"}, "train", c);
  return c;
}

// The tensor (and tensor rank) that holds value `offset` of `layout`'s buffer, for errors about shard coverage.
std::string value_name(const ParamLayout& layout, size_t offset) {
  std::string where = strf("value %zu of %zu", offset, layout.total());
  if (layout.tp().size > 1) where += strf(" of tensor rank %d of %d", layout.tp().rank, layout.tp().size);
  for (const TensorSpec& t : layout.tensors())
    if (offset >= t.offset && offset < t.offset + t.numel) return t.name + " (" + where + ")";
  return where;
}

State read_state(const std::string& dir) {
  const std::string what = "checkpoint " + dir + ": state.json";
  const json t = read_json_object(dir + "/state.json", what);
  State s;
  YUAN_CHECK(json_field<std::string>(t, "format", what) == kFormat, "checkpoint %s: state.json format is not %s",
             dir.c_str(), kFormat);
  s.train.step = json_field<int64_t>(t, "step", what);
  if (t.contains("run")) s.train.run = json_field<int64_t>(t, "run", what);
  s.train.next_sample = json_field<uint64_t>(t, "next_sample", what);
  s.adam_step = json_field<int64_t>(t, "adam_step", what);
  s.world = json_field<int>(t, "world", what);
  s.n_params = json_field<size_t>(t, "n_params", what);
  if (t.contains("tokenizer")) s.tokenizer = json_field<std::string>(t, "tokenizer", what);
  const auto files = t.find("files");
  YUAN_CHECK(files != t.end() && files->is_array(), "%s: no \"files\" list", what.c_str());
  for (const json& f : *files) {
    YUAN_CHECK(f.is_object(), "%s: a \"files\" entry is not an object", what.c_str());
    const std::string name = json_field<std::string>(f, "name", what);
    const std::string entry = what + ": file '" + name + "'";
    s.checksums.emplace_back(name, json_field<std::string>(f, "sha256", entry));
    if (f.contains("offset") || f.contains("pieces")) s.shards.push_back(parse_shard_entry(f, what));
  }
  YUAN_CHECK(!s.shards.empty(), "checkpoint %s: state.json lists no optimizer shards", dir.c_str());
  auto sum_of = [&](const std::string& file) {
    for (const auto& [name, sum] : s.checksums)
      if (name == file) return sum;
    throw Error(strf("%s: no \"files\" entry for %s", what.c_str(), file.c_str()));
  };
  if (!s.tokenizer.empty()) s.tokenizer_sha256 = sum_of(s.tokenizer);
  // The shards are placed by the model config.ini describes: it must be the one that was written.
  YUAN_CHECK(sha256_file(dir + "/config.ini") == sum_of("config.ini"),
             "checkpoint %s: %s/config.ini does not match its checksum", dir.c_str(), dir.c_str());
  check_coverage(what, s.shards, read_config(dir).model);
  // Last, so that an edited entry is reported by what is wrong with it rather than as a checksum mismatch.
  s.sealed = t.contains("sha256");
  if (s.sealed)
    YUAN_CHECK(json_field<std::string>(t, "sha256", what) == json_checksum(t),
               "%s does not match its own sha256: it was changed after it was written", what.c_str());
  return s;
}

// What is wrong with file `path` against its checksum `sum` ("" when nothing is); throws when it cannot be read.
std::string file_problem(const std::string& path, const std::string& sum) {
  if (!fs::exists(path)) return path + " is missing";
  if (sha256_file(path) != sum) return path + " does not match its checksum";
  return "";
}

// Hashes the files of `checksums` (file, sha256) that are this rank's share (every `world`-th, from `rank`) on the
// process's threads; throws naming the first (in state.json's order) that is missing or does not match.
void check_files(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& checksums, int rank,
                 int world) {
  std::vector<std::string> errors(checksums.size());
  const int n = static_cast<int>(checksums.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = rank; i < n; i += world) {
    try {
      errors[i] = file_problem(dir + "/" + checksums[i].first, checksums[i].second);
    } catch (const std::exception& e) {  // nothing may leave an OpenMP region
      errors[i] = e.what();  // sha256_file and std::filesystem name the file
    }
  }
  for (const std::string& e : errors) YUAN_CHECK(e.empty(), "%s", e.c_str());
}

void warn_unsealed(const std::string& dir, const State& s) {
  if (!s.sealed)
    warn("checkpoint %s: state.json has no sha256 of its own (written by an older yuanlm); its entries are checked "
         "for consistency only", dir.c_str());
}

// A checkpoint's ckpt.resume=DIR / auto-resume check, collective only through the caller: this rank's share of the
// files. Returns what is wrong ("" when nothing is).
std::string verify(const std::string& dir, int rank, int world) {
  try {
    const State s = read_state(dir);
    warn_unsealed(dir, s);
    check_files(dir, s.checksums, rank, world);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// A checkpoint under run.dir/ckpt: its directory name, step, and the run that wrote it.
struct Listed {
  std::string name;
  int64_t run = 0, step = 0;
  bool unreadable = false;  // its state.json cannot be read: no reader can use it, nor tell its run
};

// The step_* directories under `root`, newest first by (run, step). The run comes from state.json; one that
// cannot be read counts as run 0, the oldest, and is marked unreadable.
std::vector<Listed> list_checkpoints(const std::string& root) {
  std::vector<Listed> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    char* end = nullptr;
    if (!e.is_directory() || name.rfind("step_", 0) != 0) continue;
    const long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    Listed l{name, 0, step};
    try {
      const json t = json::parse(read_text(e.path().string() + "/state.json"));
      if (t.is_object() && t.contains("run") && t["run"].is_number_unsigned()) l.run = t["run"].get<int64_t>();
    } catch (const std::exception&) {
      l.unreadable = true;
    }
    out.push_back(l);
  }
  std::sort(out.begin(), out.end(),
            [](const Listed& a, const Listed& b) { return std::tie(a.run, a.step) > std::tie(b.run, b.step); });
  return out;
}

// Refuses shards of `glob` made by another tokenizer than checkpoint `dir`'s (the file `tokenizer`, "" when it has
// none) whose sha256 is `sum`; a shard without a sha256 in its tokenizer attribute says nothing and is accepted.
// The loader checks that all shards of a glob agree, so the first speaks for them. Every rank that reads the data
// checks the same files, so the error is collective.
void check_shard_tokenizer(const std::string& dir, const std::string& tokenizer, const std::string& sum,
                           const std::string& glob) {
  if (tokenizer.empty()) return;
  const std::vector<std::string> shards = expand_glob(glob);
  if (shards.empty()) return;  // the loader reports it
  const std::string shard_tok = ShardReader(shards[0], 1).meta().tokenizer;
  const size_t at = shard_tok.rfind("sha256:");
  if (at == std::string::npos) return;
  if (shard_tok.compare(at + 7, std::string::npos, sum) != 0)
    throw Error(strf("%s was made by tokenizer '%s', checkpoint %s by %s (sha256:%s): its token ids mean other text",
                     shards[0].c_str(), shard_tok.c_str(), dir.c_str(), tokenizer.c_str(), sum.c_str()),
                true);
}

// Fills dst with tensor `name` (of kShardTensors) of the runs `want` of the whole model's flat buffer (Run::local
// indexes dst), out of the shard files that cover them, whatever tensor-parallel layout wrote them.
void read_runs(const std::string& dir, const std::vector<ShardFile>& shards, const GPTConfig& model, const char* name,
               const std::vector<ParamLayout::Run>& want, float* dst) {
  for (const ShardFile& f : shards) {
    std::optional<SafetensorsReader> r;
    const float* src = nullptr;
    for_overlaps(file_runs(model, f), want, [&](size_t from, size_t to, size_t n) {
      if (!r) {
        r.emplace(dir + "/" + f.name);
        const SafeTensorInfo& info = r->info(name);
        YUAN_CHECK(info.dtype == "F32" && info.numel() == f.count, "checkpoint %s/%s: tensor '%s' is not F32[%zu]",
                   dir.c_str(), f.name.c_str(), name, f.count);
        src = reinterpret_cast<const float*>(r->raw(name));
      }
      std::memcpy(dst + to, src + from, n * sizeof(float));
    });
  }
}

}  // namespace

std::string json_checksum(json t) {
  t.erase("sha256");
  return sha256_hex(t.dump());
}

// Refuses optimizer shards that do not hold every value of the model exactly once per tensor-parallel rank: each
// tensor rank's data group shards the model as that rank holds it (split tensors cut, replicated ones whole), so
// the shards of one tensor rank must tile its layout. Values past the end are the padding of older checkpoints.
void check_coverage(const std::string& what, const std::vector<ShardFile>& shards, const GPTConfig& model) {
  const ShardFile& first = shards.front();
  for (const ShardFile& f : shards) {
    YUAN_CHECK(f.tp_size == first.tp_size, "%s: file '%s' is for %d tensor-parallel ranks, '%s' for %d", what.c_str(),
               f.name.c_str(), f.tp_size, first.name.c_str(), first.tp_size);
    YUAN_CHECK(f.tp_rank < f.tp_size, "%s: file '%s': tp_rank %d is not below tp_size %d", what.c_str(),
               f.name.c_str(), f.tp_rank, f.tp_size);
  }
  struct Span {
    size_t lo, hi;
    const std::string* file;
  };
  for (int r = 0; r < first.tp_size; r++) {
    const ParamLayout layout(model, held_modules(model, all_modules(model)), {r, first.tp_size});
    const size_t total = layout.total();
    std::vector<Span> spans;
    for (const ShardFile& f : shards) {
      if (f.tp_rank != r) continue;
      for (const ShardPiece& p : f.pieces) {
        const size_t lo = std::min(p.model_offset, total);
        if (lo < total) spans.push_back({lo, lo + std::min(p.count, total - lo), &f.name});
      }
    }
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
    size_t next = 0;
    const std::string* prev = nullptr;
    for (const Span& sp : spans) {
      YUAN_CHECK(sp.lo >= next, "%s: files '%s' and '%s' both hold %s", what.c_str(), prev->c_str(), sp.file->c_str(),
                 value_name(layout, sp.lo).c_str());
      YUAN_CHECK(sp.lo == next, "%s: no optimizer shard holds %s", what.c_str(), value_name(layout, next).c_str());
      next = sp.hi;
      prev = sp.file;
    }
    YUAN_CHECK(next == total, "%s: no optimizer shard holds %s", what.c_str(), value_name(layout, next).c_str());
  }
}

ShardFile parse_shard_entry(const json& f, const std::string& what) {
  const std::string name = json_field<std::string>(f, "name", what);
  const std::string entry = what + ": file '" + name + "'";
  ShardFile shard{name, json_field<size_t>(f, "count", entry), {}};
  if (f.contains("offset")) {
    shard.pieces.push_back({json_field<size_t>(f, "offset", entry), shard.count});
  } else {
    size_t total = 0;
    const auto pieces = f.find("pieces");
    YUAN_CHECK(pieces != f.end() && pieces->is_array(), "%s: no \"offset\" or \"pieces\"", entry.c_str());
    for (const json& p : *pieces) {
      YUAN_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_unsigned() && p[1].is_number_unsigned(),
                 "%s: \"pieces\" must be a list of [offset, count] pairs", entry.c_str());
      shard.pieces.push_back({p[0].get<size_t>(), p[1].get<size_t>()});
      total += shard.pieces.back().count;
    }
    YUAN_CHECK(total == shard.count, "%s: its pieces hold %zu values, \"count\" says %zu", entry.c_str(), total,
               shard.count);
  }
  if (f.contains("tp_size")) {
    shard.tp_rank = json_field<int>(f, "tp_rank", entry);
    shard.tp_size = json_field<int>(f, "tp_size", entry);
  }
  return shard;
}

std::vector<ParamLayout::Run> file_runs(const GPTConfig& model, const ShardFile& f) {
  const ParamLayout layout(model, held_modules(model, all_modules(model)), {f.tp_rank, f.tp_size});
  // Values past the parameters (the padding of older checkpoints) belong nowhere and are never read.
  const size_t total = layout.total();
  std::vector<ParamLayout::Run> have;
  size_t pos = 0;
  for (const ShardPiece& p : f.pieces) {
    const size_t count = std::min(p.count, total - std::min(p.model_offset, total));
    for (ParamLayout::Run run : layout.global_runs(p.model_offset, count)) {
      run.local = run.local - p.model_offset + pos;
      have.push_back(run);
    }
    pos += p.count;
  }
  return have;
}

std::vector<ParamLayout::Run> wanted_runs(const GPTConfig& model, const ZeroOptimizer& opt) {
  // The shard's place in the whole model: pieces of tensors when it is a tensor rank's part.
  const ParamLayout mine(model, held_modules(model, all_modules(model)), opt.tensor_parallel());
  std::vector<ParamLayout::Run> want;
  size_t pos = 0;
  for (const ShardPiece& p : opt.shard_pieces()) {
    for (ParamLayout::Run run : mine.global_runs(p.model_offset, p.count)) {
      run.local = run.local - p.model_offset + pos;
      want.push_back(run);
    }
    pos += p.count;
  }
  return want;
}

void for_overlaps(const std::vector<ParamLayout::Run>& have, const std::vector<ParamLayout::Run>& want,
                  const std::function<void(size_t from, size_t to, size_t n)>& copy) {
  for (const ParamLayout::Run& h : have)
    for (const ParamLayout::Run& w : want) {
      const size_t lo = std::max(h.global, w.global), hi = std::min(h.global + h.count, w.global + w.count);
      if (lo < hi) copy(h.local + (lo - h.global), w.local + (lo - w.global), hi - lo);
    }
}

bool same_model(const GPTConfig& a, const GPTConfig& b) {
  return a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_embd == b.n_embd && a.seq_len == b.seq_len &&
         a.vocab_size == b.vocab_size;
}

std::vector<ZeroOptimizer*> saved_optimizers(const ZeroOptimizers& opts) {
  std::vector<ZeroOptimizer*> out;
  for (const auto& opt : opts.all())
    if (opt->stage().shards_optimizer_state() || opt->group_rank() == 0) out.push_back(opt.get());
  return out;
}

std::string shard_file_name(int rank, const ZeroOptimizer& opt) {
  return strf("optim_%05d_%03d.safetensors", rank, opt.modules().first);
}

namespace {
SafetensorsWriter shard_writer(size_t count, const float* const tensors[3]) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(count)};
  SafetensorsWriter out;
  for (int i = 0; i < 3; i++) out.add_f32(kShardTensors[i], shape, tensors[i]);
  return out;
}
}  // namespace

void write_shard_file(const std::string& path, size_t count, const float* const tensors[3], std::string* sha256) {
  shard_writer(count, tensors).write(path, sha256);
}

std::string shard_file_prefix(size_t count) {
  const float* const none[3] = {nullptr, nullptr, nullptr};
  return shard_writer(count, none).prefix();
}

ordered_json shard_entry(const ZeroOptimizer& opt, const std::string& file) {
  ordered_json entry = {{"name", file}};
  const std::vector<ShardPiece> pieces = opt.shard_pieces();
  if (pieces.size() == 1) {
    entry["offset"] = pieces[0].model_offset;
  } else {
    entry["pieces"] = ordered_json::array();
    for (const ShardPiece& p : pieces) entry["pieces"].push_back({p.model_offset, p.count});
  }
  entry["count"] = opt.shard_size();
  const TensorParallel& tp = opt.tensor_parallel();
  if (tp.size > 1) entry["tp_rank"] = tp.rank, entry["tp_size"] = tp.size;
  return entry;
}

std::string save_checkpoint(const Config& cfg, const TrainState& st, ZeroOptimizers& opts,
                            const std::string& tokenizer_file) {
  const comm::WorldInfo& w = comm::world();
  const std::string root = cfg.run.dir + "/ckpt", name = step_name(st.step);
  const std::string final_dir = root + "/" + name, tmp = root + "/.tmp_" + name;
  if (w.rank == 0) {
    make_dirs(root);
    fs::remove_all(tmp);
    make_dirs(tmp);
  }
  comm::barrier();

  // One file per optimizer shard, named by rank and first module; zero 0 keeps a group's whole state on every
  // member, so its rank 0 writes it once.
  ordered_json mine = ordered_json::array();
  for (ZeroOptimizer* opt : saved_optimizers(opts)) {
    const std::string file = shard_file_name(w.rank, *opt);
    const float* const tensors[3] = {opt->master(), opt->exp_avg(), opt->exp_avg_sq()};
    ordered_json entry = shard_entry(*opt, file);
    std::string sha256;
    write_shard_file(tmp + "/" + file, opt->shard_size(), tensors, &sha256);
    entry["sha256"] = sha256;
    mine.push_back(std::move(entry));
  }
  // Each rank's files entries travel as JSON text; rank 0 assembles state.json.
  const std::vector<std::string> entries = comm::gather_strings(mine.dump());
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
    ordered_json state = {{"format", kFormat},
                          {"step", st.step},
                          {"run", st.run},
                          {"next_sample", st.next_sample},
                          {"adam_step", opts.all().front()->adam_step()},
                          {"world", w.size},
                          {"zero", opts.stage().number()},
                          {"n_params", ParamLayout(cfg.model).total()},
                          {"tokenizer", tok},
                          {"files", files}};
    state["sha256"] = json_checksum(json::parse(state.dump()));
    write_file_atomic(tmp + "/state.json", state.dump(2) + "\n");
    sync_dir(tmp);
    fs::remove_all(final_dir);  // a checkpoint of the same step from before a crash is superseded
    fs::rename(tmp, final_dir);
    sync_dir(root);
    write_file_atomic(root + "/latest", name + "\n");
    // Keep the newest ckpt.keep by (run, step), and always this one, which latest names.
    int kept = 1;
    for (const Listed& c : list_checkpoints(root))
      if (c.name != name && kept++ >= cfg.ckpt.keep) fs::remove_all(root + "/" + c.name);
  }
  comm::barrier();
  return final_dir;
}

namespace {

// run.dir/runs.jsonl's lines that are records (a line torn by a crash, or anything else, says nothing), each ending
// in a newline, and the highest run among them.
struct RunRecords {
  std::string text;
  int64_t highest = 0;
};
RunRecords read_run_records(const std::string& run_dir) {
  RunRecords r;
  std::ifstream in(run_dir + "/runs.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json rec = json::parse(line, nullptr, false);
    if (!rec.is_object() || !rec.contains("run") || !rec["run"].is_number_integer()) continue;
    r.highest = std::max(r.highest, rec["run"].get<int64_t>());
    r.text += line + "\n";
  }
  return r;
}

}  // namespace

void record_run(const std::string& run_dir, int64_t run, int64_t step, const std::string& from) {
  const comm::WorldInfo& w = comm::world();
  const std::time_t now = std::time(nullptr);
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  ordered_json rec = {{"run", run}, {"started", started}, {"host", w.host}, {"world", w.size}};
  if (const char* job = std::getenv("SLURM_JOB_ID")) rec["slurm_job"] = job;
  rec["step"] = step;
  rec["from"] = from;
  write_file_atomic(run_dir + "/runs.jsonl", read_run_records(run_dir).text + rec.dump() + "\n");
}

ResumeChoice choose_resume(const Config& cfg) {
  const comm::WorldInfo& w = comm::world();
  const std::string root = cfg.run.dir + "/ckpt";
  // Ranks may see different directory listings on a lagging filesystem: rank 0's list decides. Its first line is
  // the highest run recorded in run.dir/runs.jsonl.
  std::string joined;
  if (w.rank == 0) {
    joined = strf("%lld\n", static_cast<long long>(read_run_records(cfg.run.dir).highest));
    for (const Listed& l : list_checkpoints(root))
      joined += strf("%lld %lld %s %d\n", static_cast<long long>(l.run), static_cast<long long>(l.step),
                     l.name.c_str(), l.unreadable);
  }
  joined = comm::broadcast_string(joined, 0);
  std::istringstream in(joined);
  int64_t recorded = 0;
  in >> recorded;
  std::vector<Listed> listed;
  for (Listed l; in >> l.run >> l.step >> l.name >> l.unreadable;) listed.push_back(l);

  ResumeChoice choice;
  choice.run = std::max(recorded, listed.empty() ? int64_t{0} : listed.front().run) + 1;
  if (cfg.ckpt.resume == "none") {
    if (!listed.empty())
      throw Error(strf("run.dir %s already holds checkpoints (the newest is %s/%s) and ckpt.resume=none would start "
                       "over in it, truncating its metrics.jsonl: continue with ckpt.resume=auto, start from a "
                       "checkpoint with ckpt.resume=DIR, or give another run.dir",
                       cfg.run.dir.c_str(), root.c_str(), listed.front().name.c_str()),
                  true);
    return choice;
  }
  if (cfg.ckpt.resume != "auto") {
    const std::string why = checkpoint_problem(cfg.ckpt.resume);
    if (!why.empty()) throw Error(strf("ckpt.resume=%s: %s", cfg.ckpt.resume.c_str(), why.c_str()), true);
    choice.dir = cfg.ckpt.resume;
    return choice;
  }
  for (const Listed& l : listed) {
    const std::string dir = root + "/" + l.name;
    if (!l.unreadable) {
      choice.candidates.push_back({dir, l.run, l.step});
      continue;
    }
    // Named like every other checkpoint that fails, though it cannot even be ordered among them.
    std::error_code ec;
    const auto bytes = fs::file_size(dir + "/state.json", ec);
    warn("skipping checkpoint %s: %s", dir.c_str(),
         ec ? strf("%s/state.json cannot be read: %s", dir.c_str(), ec.message().c_str()).c_str()
         : bytes == 0 ? strf("%s/state.json is empty (0 bytes)", dir.c_str()).c_str()
                      : strf("%s/state.json is not JSON", dir.c_str()).c_str());
  }
  return choice;
}

std::string checkpoint_problem(const std::string& dir) {
  const comm::WorldInfo& w = comm::world();
  return comm::first_problem(verify(dir, w.rank, w.size));
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
  const std::string tokenizer = s.tokenizer.empty() ? "" : dir + "/" + s.tokenizer;
  check_shard_tokenizer(dir, tokenizer, s.tokenizer_sha256, cfg.data.train);
  if (!cfg.data.val.empty()) check_shard_tokenizer(dir, tokenizer, s.tokenizer_sha256, cfg.data.val);
  for (const auto& opt : opts.all()) {
    const std::vector<ParamLayout::Run> want = wanted_runs(cfg.model, *opt);
    float* const tensors[3] = {opt->master(), opt->exp_avg(), opt->exp_avg_sq()};
    for (int i = 0; i < 3; i++) read_runs(dir, s.shards, cfg.model, kShardTensors[i], want, tensors[i]);
    opt->set_adam_step(s.adam_step);
    opt->load_backend_params();
  }
  say("resumed from %s: step %lld, written by %d ranks%s", dir.c_str(), static_cast<long long>(s.train.step), s.world,
      s.world != comm::world().size ? strf(", optimizer state re-cut for %d", comm::world().size).c_str() : "");
  return s.train;
}

void load_hf_init(const std::string& dir, const Config& cfg, ZeroOptimizers& opts) {
  std::unique_ptr<HfGpt2Weights> hf;
  comm::refuse_together([&] { hf = std::make_unique<HfGpt2Weights>(dir, cfg.model); });
  for (const auto& opt : opts.all()) {
    float* master = opt->master();
    for (const ParamLayout::Run& run : wanted_runs(cfg.model, *opt))
      hf->read(run.global, run.count, master + run.local);
    opt->load_backend_params();
  }
  say("init.from %s: the weights of a HuggingFace GPT-2 (%zu parameters), optimizer moments zero", dir.c_str(),
      ParamLayout(cfg.model).total());
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  CheckpointInfo c;
  c.dir = path;
  if (!fs::exists(path + "/state.json")) {
    std::string latest = path + "/ckpt/latest";
    YUAN_CHECK(fs::exists(latest), "'%s' is neither a checkpoint (no state.json) nor a run directory (no ckpt/latest)",
               path.c_str());
    std::string name = read_text(latest);
    name.erase(name.find_last_not_of(" \n") + 1);
    c.dir = path + "/ckpt/" + name;
  }
  State s = read_state(c.dir);
  warn_unsealed(c.dir, s);
  c.cfg = read_config(c.dir);
  c.step = s.train.step;
  c.world = s.world;
  YUAN_CHECK(s.n_params == ParamLayout(c.cfg.model).total(),
             "checkpoint %s: %zu parameters in state.json, config.ini describes %zu", c.dir.c_str(), s.n_params,
             ParamLayout(c.cfg.model).total());
  if (!s.tokenizer.empty()) {
    c.tokenizer = c.dir + "/" + s.tokenizer;
    // Commands read it before the shards are verified: it must already be the one that was written.
    const std::string problem = file_problem(c.tokenizer, s.tokenizer_sha256);
    YUAN_CHECK(problem.empty(), "%s", problem.c_str());
  }
  c.tokenizer_sha256 = s.tokenizer_sha256;
  c.shards = std::move(s.shards);
  c.checksums = std::move(s.checksums);
  return c;
}

CheckpointModel load_checkpoint_model(CheckpointInfo info) {
  CheckpointModel m;
  static_cast<CheckpointInfo&>(m) = std::move(info);
  check_files(m.dir, m.checksums, 0, 1);
  const size_t n = ParamLayout(m.cfg.model).total();
  allocating(n * sizeof(float), "the checkpoint's weights", [&] { m.weights.resize(n); });
  read_runs(m.dir, m.shards, m.cfg.model, "master", {{0, 0, n}}, m.weights.data());
  return m;
}

CheckpointModel load_checkpoint_model(const std::string& path) {
  return load_checkpoint_model(read_checkpoint_info(path));
}

void check_tokenizer(const CheckpointInfo& c, const std::string& glob) {
  check_shard_tokenizer(c.dir, c.tokenizer, c.tokenizer_sha256, glob);
}

}  // namespace yuan
