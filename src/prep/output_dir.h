// prep's output directory, replaced whole or not at all. Everything is written into a fresh directory beside
// --out (same parent, so a rename can move it), and commit() swaps it in: with renameat2(RENAME_EXCHANGE) in one
// atomic step, on file systems without it (NFS, some parallel ones) by moving the old directory aside first.
// Until then the previous corpus is untouched, and a failure (an exception unwinding past this object) removes
// the unfinished directory. Siblings left by a prep that was killed are cleaned up by the next one.
#pragma once
#include <string>

namespace yuan {

// Whether `name` is a file prep writes into --out (shards, manifest.json, tokenizer, and their .tmp forms): a
// directory holding anything else is refused rather than replaced, so no file prep did not write is lost.
bool is_prep_output(const std::string& name);

class StagedOutput {
 public:
  // Checks --out (a directory, or absent; only prep's files in it; writable), removes or restores what killed
  // preps left beside it, and creates the staging directory. Throws Error naming the path.
  explicit StagedOutput(const std::string& out);
  ~StagedOutput();  // without commit(): removes the staging directory
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  const std::string& dir() const { return stage_; }  // where the new corpus is written
  // Puts the staged directory at --out and removes the previous one.
  void commit();

 private:
  std::string sibling(const char* kind) const;  // ".NAME.KIND-PID@HOST" beside --out
  void clean_stale_siblings() const;

  std::string out_, parent_, name_, stage_;  // out_: --out, absolute, symlinks resolved
  bool committed_ = false;
};

}  // namespace yuan
