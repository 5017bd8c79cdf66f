#include "prep/output_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"

namespace yuan {

namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool is_prep_output(const std::string& name) {
  const std::string n = ends_with(name, ".tmp") ? name.substr(0, name.size() - 4) : name;
  return n == "manifest.json" || n == "tokenizer" || starts_with(n, "tokenizer.") ||
         ((starts_with(n, "train_") || starts_with(n, "val_")) && ends_with(n, ".h5"));
}

StagedOutput::StagedOutput(const std::string& out) {
  YUAN_CHECK(!out.empty(), "prep: --out is empty");
  // Symlinks resolved: the swap must replace the directory the corpus is in, not a link to it.
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(out), ec);
  YUAN_CHECK(!ec, "prep: --out %s: %s", out.c_str(), ec.message().c_str());
  if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
  YUAN_CHECK(p.has_filename() && p != p.root_path(), "prep: --out %s: cannot be the root directory", out.c_str());
  out_ = p.string();
  parent_ = p.parent_path().string();
  name_ = p.filename().string();

  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st)) {
    YUAN_CHECK(fs::is_directory(st), "prep: --out %s exists and is not a directory", out.c_str());
    for (const auto& e : fs::directory_iterator(p)) {
      const std::string n = e.path().filename().string();
      YUAN_CHECK(is_prep_output(n),
                 "prep: --out %s holds '%s', which prep does not write; the new corpus replaces the directory "
                 "whole, so move that elsewhere or choose another --out", out.c_str(), n.c_str());
    }
    // The previous corpus is removed after the swap, which needs write permission inside it.
    YUAN_CHECK(::access(out_.c_str(), W_OK) == 0, "prep: --out %s is not writable: %s", out.c_str(),
               std::strerror(errno));
  }
  make_dirs(parent_);
  clean_stale_siblings();
  stage_ = sibling("tmp");
  fs::remove_all(stage_, ec);  // our own pid: a stale directory of a dead process that had it
  YUAN_CHECK(::mkdir(stage_.c_str(), 0755) == 0, "prep: --out %s: cannot create %s: %s", out.c_str(), stage_.c_str(),
             std::strerror(errno));
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(stage_, ec);
}

std::string StagedOutput::sibling(const char* kind) const {
  return (fs::path(parent_) / staging_dir_name(name_, kind, host_name())).string();
}

// A prep killed while writing leaves its staging directory ("tmp"); one killed between the two renames of the
// fallback swap leaves the previous corpus moved aside ("old") and possibly no --out at all. Only siblings of
// this host are judged: a pid on another host says nothing about whether that prep still runs.
void StagedOutput::clean_stale_siblings() const {
  const std::string host = host_name();
  for (const auto& e : fs::directory_iterator(parent_)) {
    const std::optional<StagingDirName> s = parse_staging_dir_name(e.path().filename().string(), name_);
    if (!s || (s->kind != "tmp" && s->kind != "old")) continue;
    const std::string path = e.path().string();
    if (s->host != host) {
      warn("prep: leaving %s alone: a prep on %s (pid %ld) may still be writing it; remove it if none is",
           path.c_str(), s->host.c_str(), s->pid);
      continue;
    }
    if (!staging_owner_gone(*s, host)) continue;  // that prep still runs
    if (s->kind == "old" && !fs::exists(out_)) {
      YUAN_CHECK(std::rename(path.c_str(), out_.c_str()) == 0, "prep: cannot move %s back to %s: %s", path.c_str(),
                 out_.c_str(), std::strerror(errno));
      say("prep: restored %s from %s, where a prep killed while replacing it (pid %ld) had moved it", out_.c_str(),
          path.c_str(), s->pid);
      continue;
    }
    std::error_code ec;
    fs::remove_all(path, ec);
    YUAN_CHECK(!ec, "prep: cannot remove %s, left by a prep that did not finish: %s", path.c_str(),
               ec.message().c_str());
    say("prep: removed %s, left by a prep that did not finish (pid %ld)", path.c_str(), s->pid);
  }
}

void StagedOutput::commit() {
  std::string previous;  // where the old corpus is once the new one is in place
  if (!fs::exists(out_)) {
    YUAN_CHECK(std::rename(stage_.c_str(), out_.c_str()) == 0, "prep: cannot move %s to %s: %s", stage_.c_str(),
               out_.c_str(), std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) == 0) {
    previous = stage_;
  } else {
    YUAN_CHECK(errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP,
               "prep: cannot swap %s into %s: %s; the previous corpus is unchanged", stage_.c_str(), out_.c_str(),
               std::strerror(errno));
    previous = sibling("old");
    YUAN_CHECK(std::rename(out_.c_str(), previous.c_str()) == 0,
               "prep: cannot move the previous corpus %s aside to %s: %s; it is unchanged", out_.c_str(),
               previous.c_str(), std::strerror(errno));
    if (std::rename(stage_.c_str(), out_.c_str()) != 0) {
      const int e = errno;
      YUAN_CHECK(std::rename(previous.c_str(), out_.c_str()) == 0,
                 "prep: cannot move %s to %s (%s), nor the previous corpus back from %s: %s", stage_.c_str(),
                 out_.c_str(), std::strerror(e), previous.c_str(), std::strerror(errno));
      throw Error(strf("prep: cannot move %s to %s: %s; the previous corpus is unchanged", stage_.c_str(),
                       out_.c_str(), std::strerror(e)));
    }
  }
  committed_ = true;
  sync_dir(parent_);
  if (previous.empty()) return;
  std::error_code ec;
  fs::remove_all(previous, ec);
  if (ec)
    warn("prep: the previous corpus, now in %s, could not be removed: %s", previous.c_str(), ec.message().c_str());
}

}  // namespace yuan
