// What a run reports: the human step line on stdout and one JSON object per line in run.dir/metrics.jsonl
// (rank 0 only), which tools/ and the tests read back.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/groups.h"
#include "comm/watchdog.h"
#include "optim/zero.h"

namespace yuan {

// One JSON object on one line, keys in the order they are added.
class JsonLine {
 public:
  JsonLine& add(const char* key, double v);  // non-finite values become null
  JsonLine& add(const char* key, long long v);
  JsonLine& add(const char* key, const std::string& v);
  JsonLine& add(const char* key, const std::vector<double>& v);
  JsonLine& add(const char* key, nlohmann::ordered_json v);  // a nested object
  std::string str() const;

 private:
  nlohmann::ordered_json j_ = nlohmann::ordered_json::object();
};

class MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::string& path);  // appends; throws naming the file when it cannot open it
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const JsonLine& line);  // one line, flushed: a killed job keeps every finished step

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

// One training step's figures, filled by the trainer's loop and rendered only here: the step line on stdout and
// the step's object in metrics.jsonl (whose keys, in their order, tools/plot_metrics.py and the tests read).
struct StepMetrics {
  int step = 0, steps = 0;  // steps done, of train.steps
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0;
  double step_s = 0, data_s = 0, compute_s = 0, comm_s = 0, optim_s = 0, optim_background_s = 0;
  // With the optimizer state on the host: its transfers and AdamW, and what of them the step waited for.
  std::optional<OffloadSplit> offload;
  // The fast tier's checkpoint after the step (ckpt.local_every), on this rank: the copy into node memory the step's
  // thread makes, and its wait for the previous one's write; 0 after a step with none. Not in step_s: tokens_per_s
  // and MFU stay the step's own, the ETA counts it.
  double local_ckpt_s = 0;
  double wait_max_s = 0;  // this rank's longest wait in the step (comm/watchdog.h)
  // The rank whose own work (the step less its waits) took longest, where it runs, and what it cost the step: its
  // work beyond the middle rank's, which the others spend waiting for it (rank 0's figures; elsewhere rank 0 at 0).
  int slowest_rank = 0;
  std::string slowest_host;
  double straggler_s = 0;
  // What every rank spent waiting: the step less the slowest rank's work (rank 0's figure). A slow link or a step
  // bound by its transfers shows here rather than as a slowest rank, since no rank's own work is what is late.
  double all_wait_s = 0;
  // A wait the job rode out since the previous step line (a link back within the deadline, a peer stopped for a
  // while), set where the line shows it.
  std::optional<comm::LongestWait> stall;
  double eta_s = 0;  // the steps left at the mean time of the steps after this run's first
  bool skipped = false;
  long long tokens = 0;  // trained on so far
  size_t peak_host_bytes = 0, base_host_bytes = 0;
  // This rank's tensor traffic at the start of the step and at its end (the step's is the difference).
  comm::GroupTraffic traffic_start = {}, traffic_end = {};
  // Pipelined layouts only: the share of the step each stage waits, and each stage's busy share.
  std::optional<double> bubble;
  std::vector<double> stage_busy;
};
// "step     10/100 | loss 5.1234 | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 1.2% | 250 ms/step | ETA 1m02s"
std::string step_line(const StepMetrics& m);
JsonLine step_record(const StepMetrics& m);

// Keeps what a run resuming at `step` will not write again: the training steps up to `step` and the evaluations
// before it (the run evaluates at `step` as it starts). Rewrites the file atomically; a missing file is fine.
void truncate_metrics(const std::string& path, int64_t step);

std::string format_duration(double seconds);  // "1h02m", "3m07s", "42s"

}  // namespace yuan
