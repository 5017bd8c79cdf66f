#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <cstdio>
#include <fstream>

#include "util/error.h"
#include "util/fs.h"

namespace yuan {

JsonLine& JsonLine::add(const char* key, double v) {
  // JSON has no NaN or Infinity; null keeps the line parseable and the bad value visible.
  kv_.emplace_back(key, std::isfinite(v) ? strf("%.9g", v) : "null");
  return *this;
}

JsonLine& JsonLine::add(const char* key, long long v) {
  kv_.emplace_back(key, std::to_string(v));
  return *this;
}

JsonLine& JsonLine::add(const char* key, const std::string& v) {
  std::string s = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') s += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      s += strf("\\u%04x", c);
      continue;
    }
    s += c;
  }
  kv_.emplace_back(key, s + "\"");
  return *this;
}

JsonLine& JsonLine::add(const char* key, const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + (std::isfinite(v[i]) ? strf("%.9g", v[i]) : "null");
  kv_.emplace_back(key, s + "]");
  return *this;
}

std::string JsonLine::str() const {
  std::string s = "{";
  for (size_t i = 0; i < kv_.size(); i++) s += (i ? ", \"" : "\"") + kv_[i].first + "\": " + kv_[i].second;
  return s + "}";
}

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "a");
  YUAN_CHECK(f_, "cannot open metrics file '%s': %s", path.c_str(), std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const JsonLine& line) {
  if (!f_) return;
  std::string s = line.str() + "\n";
  YUAN_CHECK(std::fwrite(s.data(), 1, s.size(), f_) == s.size() && std::fflush(f_) == 0,
             "cannot write metrics file '%s': %s", path_.c_str(), std::strerror(errno));
}

// Keeps what a run starting at `step` will not write again: the training steps up to `step` and the
// evaluations before it (the run evaluates at `step` as it starts).
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    long long s = -1;
    if (std::sscanf(line.c_str(), "{\"step\": %lld", &s) != 1) continue;
    const bool eval = line.find("\"val_loss\"") != std::string::npos;
    if (eval ? s < step : s <= step) kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = std::lround(s);
  if (t >= 3600) return strf("%ldh%02ldm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return strf("%ldm%02lds", t / 60, t % 60);
  return strf("%lds", t);
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    u++;
  }
  return strf(u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

}  // namespace yuan
