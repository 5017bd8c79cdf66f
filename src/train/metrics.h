// What a run reports: the human step line on stdout and one JSON object per line in run.dir/metrics.jsonl
// (rank 0 only), which tools/ and the tests read back.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

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

// Keeps what a run resuming at `step` will not write again: the training steps up to `step` and the evaluations
// before it (the run evaluates at `step` as it starts). Rewrites the file atomically; a missing file is fine.
void truncate_metrics(const std::string& path, int64_t step);

std::string format_duration(double seconds);  // "1h02m", "3m07s", "42s"

}  // namespace yuan
