// `yuanlm export`: a checkpoint as a HuggingFace GPT-2 directory that GPT2LMHeadModel.from_pretrained loads
// unchanged: renaming plus one transpose (model/hf_gpt2.h, which init.from reads back by). lm_head.weight is not
// written: HF ties it to transformer.wte.weight, as GPT-2's own checkpoints do.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm/world.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
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

// The name HF's tokenizers look for: SentencePiece models as tokenizer.model, a byte-level BPE as tokenizer.json
// (GPT2TokenizerFast), WordPiece vocabularies (BertTokenizer) as vocab.txt.
std::string hf_tokenizer_name(const std::string& path) {
  const fs::path ext = fs::path(path).extension();
  return ext == ".model" ? "tokenizer.model" : ext == ".json" ? "tokenizer.json" : "vocab.txt";
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

// An exclusive flock(2) on the directory `dir` itself, waited for, held until the object goes: exports into one
// existing --out move their files in one after the other, never interleaved (which could leave files of two exports
// side by side). A filesystem without flock on directories (NFS turns flock into fcntl locks, which a directory opened
// read-only cannot take) goes without, as before there was one. The kernel drops it when its process dies.
class DirLock {
 public:
  explicit DirLock(const fs::path& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) return;
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_;
};

// The names in a staging directory, sorted: its files move into --out in this order (the test hook below counts on
// it).
std::vector<fs::path> staged_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) files.push_back(e.path());
  YUAN_CHECK(!ec, "export: cannot list %s: %s", dir.c_str(), ec.message().c_str());
  std::sort(files.begin(), files.end());
  return files;
}

// Test hook (tests/mpi/test_fail_inputs.sh): YUANLM_EXPORT_KILL_AT=staged SIGKILLs the export once every file is
// written and flushed, before the first is moved into --out; =moving SIGKILLs it right after the first one is moved.
void maybe_kill(const char* point) {
  const char* at = std::getenv("YUANLM_EXPORT_KILL_AT");
  if (at && !std::strcmp(at, point)) ::kill(::getpid(), SIGKILL);
}

// The export's files are written into a directory of this export's own beside `out`, ".NAME.export-PID@HOST", and
// flushed; only then are they moved into place, so a failed export leaves `out` as it was and two exports into one
// `out` never share a directory. A new `out` is that directory renamed, in one step. An existing one (which may hold
// the user's other files, kept) gets the files renamed into it one after the other, under a lock on `out`. Before the
// first, the staging directory is renamed ".NAME.commit-PID@HOST", a complete set: an export killed among its renames
// leaves `out` a mix of two exports, and the next export into `out` moves the rest of that set in (rolls it forward)
// before it does anything else, so `out` holds one whole set again. The staging directory goes away with this object,
// whatever happened; a later export removes one whose process was killed before it was complete.
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
    recover_orphans(true);
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

  void commit() {
    const std::vector<fs::path> files = staged_files(path_);
    for (const fs::path& f : files) sync_file(f.string());  // on disk before any is renamed into place
    sync_dir(path_.string());
    maybe_kill("staged");
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
    const DirLock lock(target_);
    // Killed since this export began: their sets are older than this one, which replaces their files now.
    recover_orphans(false);
    const fs::path committing = target_.parent_path() /
                                staging_dir_name(target_.filename().string(), "commit", process_host());
    YUAN_CHECK(std::rename(path_.c_str(), committing.c_str()) == 0, "export: cannot rename %s to %s: %s",
               path_.c_str(), committing.c_str(), std::strerror(errno));
    path_ = committing;
    sync_dir(target_.parent_path().string());
    bool first = true;
    for (const fs::path& f : staged_files(path_)) {
      YUAN_CHECK(std::rename(f.c_str(), (target_ / f.filename()).c_str()) == 0,
                 "export: cannot move %s into --out %s: %s", f.c_str(), out_.c_str(), std::strerror(errno));
      if (first) maybe_kill("moving");
      first = false;
    }
    sync_dir(target_.string());
  }

 private:
  // The staging directories beside `out` whose export is gone: a pid says nothing about another host's processes,
  // so only this host's are judged. An incomplete one (".export-") is removed. A complete one (".commit-") was killed
  // among its renames: with `roll_forward` the rest of its files are moved into `out` first (under the lock), without
  // it (this export's own set is about to replace them) it is removed.
  void recover_orphans(bool roll_forward) const {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(target_.parent_path(), ec)) {
      const std::optional<StagingDirName> s =
          parse_staging_dir_name(e.path().filename().string(), target_.filename().string());
      if (!s || (s->kind != "export" && s->kind != "commit")) continue;
      if (!staging_owner_gone(*s, process_host())) continue;  // that export still runs, or ran on another host
      if (s->kind == "commit" && roll_forward && fs::is_directory(target_, ec)) {
        const DirLock lock(target_);
        if (!fs::exists(e.path(), ec)) continue;  // another export rolled it forward while this one waited
        for (const fs::path& f : staged_files(e.path())) {
          const bool moved = std::rename(f.c_str(), (target_ / f.filename()).c_str()) == 0;
          YUAN_CHECK(moved || errno == ENOENT, "export: cannot move %s (of an export killed while it moved its files) "
                     "into --out %s: %s", f.c_str(), out_.c_str(), std::strerror(errno));
        }
        sync_dir(target_.string());
        warn("export: finished moving the files of an export into %s that was killed half-way (%s)", out_.c_str(),
             e.path().filename().c_str());
      }
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
  // Every rank reads and checks alone; a refusal is printed once (comm::refuse_together).
  CheckpointModel m;
  comm::refuse_together([&] {
    refuse_checkpoint_output(out);
    m = load_checkpoint_model(checkpoint);
  });
  if (process_rank() != 0) return 0;  // under mpirun, one writer
  StagingDir staging(out);
  const ParamLayout layout(m.cfg.model);
  SafetensorsWriter st;
  std::vector<std::vector<float>> transposed;
  transposed.reserve(layout.tensors().size());  // the writer keeps pointers into these
  for (const TensorSpec& t : layout.tensors()) {
    const float* src = m.weights.data() + t.offset;
    const std::string name = hf_gpt2_name(t);
    if (!hf_gpt2_transposed(t)) {
      st.add_f32(name, t.shape, src);
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];  // [out, in]
    std::vector<float>& dst = transposed.emplace_back(t.numel);
    hf_gpt2_transpose(src, rows, cols, dst.data());
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
  write_file_atomic(staging.file("config.json"), hf_gpt2_config(m.cfg.model, eot));
  staging.commit();
  say("export %s (step %lld) -> %s: model.safetensors (%zu parameters, fp32), config.json%s", m.dir.c_str(),
      static_cast<long long>(m.step), out.c_str(), layout.total(),
      tok_file.empty() ? ", no tokenizer (the run's shards had no manifest.json)" : (", " + tok_file).c_str());
  return 0;
}

}  // namespace yuan
