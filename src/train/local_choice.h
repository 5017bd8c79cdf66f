// The fast checkpoint tier's choice of what a launch resumes from (the tier: train/local_ckpt.h): the newest
// (run, step) whose every old rank's shard is held by some node, its copies verified, when it is newer than
// run.dir/ckpt's newest that verifies; else that one. Decisions only, on what the nodes listed
// (list_local_copies): no MPI, so that it is tested on its own (tests/test_local_choice.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"

namespace yuan {

// One copy of an old rank's shards that a node holds: read by `holder`, the node's first rank.
struct HeldCopy {
  int holder = 0;
  bool own = true;  // the rank's own copy, not a partner copy
  std::string path;
  nlohmann::json manifest;
};

// The copies of one (run, step), by old rank.
struct Generation {
  int64_t run = 0, step = 0;
  int world = 0;
  std::map<int, std::vector<HeldCopy>> copies;  // own copies first: the partner's are the spare
};

// Rank 0's choice between the generations the nodes hold and run.dir/ckpt's checkpoints: the newest complete
// generation when it is newer than the newest filesystem checkpoint not yet refused (the filesystem's wins a tie),
// else that checkpoint; whichever is next is verified in a round of its own (a generation's copies by their
// holders, a filesystem checkpoint by every rank), and what fails is dropped and the choice made again. So the
// filesystem's checkpoints are hashed only when node memory holds nothing newer.
class Chooser {
 public:
  // `listings`: every node's list_local_copies, as JSON text ("[]" from ranks that list nothing); `fs`: run.dir/ckpt's
  // candidates, newest first (choose_resume's); `hosts`: this launch's host of each rank (where a holder is).
  Chooser(const std::vector<std::string>& listings, const std::vector<ResumeChoice::Candidate>& fs,
          std::vector<std::string> hosts);
  int64_t max_run() const { return max_run_; }
  // The newest generation held, complete or not, with where one of its copies is ("" when none).
  std::string newest() const;
  // The next round: {"final": true, "assign": [...]} to load the generation assigned, {"final": true, "fs": DIR}
  // to load a filesystem checkpoint, {"final": true} to start from initialisation; {"final": false, "assign":
  // [...]} or {"final": false, "fs": DIR} to verify. An assignment names, for each old rank, the copy to load:
  // {"rank", "holder", "own", "path", "manifest"}.
  nlohmann::json next();
  // Every rank's verdict on the round's filesystem checkpoint (checkpoint_problem's).
  void fs_verdict(const std::string& why);
  // The holders' verdicts on the round's copies (verify_assigned's).
  void verdicts(const std::vector<std::string>& all);

 private:
  void report_incomplete(const Generation& g, int rank);

  std::vector<ResumeChoice::Candidate> fs_;  // newest first
  std::vector<std::string> hosts_;
  size_t fs_next_ = 0;                       // the newest not refused
  bool fs_verified_ = false;
  std::vector<Generation> gens_;  // newest first
  Generation* current_ = nullptr;
  nlohmann::json assign_;
  bool verified_ = false;
  int64_t max_run_ = 0;
  std::set<std::pair<int64_t, int64_t>> reported_;
};

// Rank `me`'s share of a round: the copies of `assign` it holds, each file checked against its CRC-32C; the
// failures as a JSON array of {"rank", "path", "why"}.
std::string verify_assigned(const nlohmann::json& assign, int me);

// The step of the last record in the metrics.jsonl at `path`: where the previous run got to (-1: no record).
int64_t last_logged_step(const std::string& path);

}  // namespace yuan
