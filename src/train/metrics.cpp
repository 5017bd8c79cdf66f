#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "util/error.h"
#include "util/fs.h"

namespace yuan {

// JSON has no NaN or Infinity; null keeps the line parseable and the bad value visible. Nine significant digits
// round-trip every float (what the values are computed in) and keep the lines short: nlohmann prints the shortest
// text that reads back as the same double.
static nlohmann::ordered_json number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return std::strtod(strf("%.9g", v).c_str(), nullptr);
}

JsonLine& JsonLine::add(const char* key, double v) {
  j_[key] = number(v);
  return *this;
}

JsonLine& JsonLine::add(const char* key, const std::vector<double>& v) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (double x : v) a.push_back(number(x));
  j_[key] = std::move(a);
  return *this;
}

JsonLine& JsonLine::add(const char* key, long long v) {
  j_[key] = v;
  return *this;
}

JsonLine& JsonLine::add(const char* key, const std::string& v) {
  j_[key] = v;
  return *this;
}

JsonLine& JsonLine::add(const char* key, nlohmann::ordered_json v) {
  j_[key] = std::move(v);
  return *this;
}

// Paths are bytes, not necessarily UTF-8: a stray byte becomes U+FFFD rather than losing the line.
std::string JsonLine::str() const { return j_.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace); }

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

std::string step_line(const StepMetrics& m) {
  // A slow rank (a loaded node, a throttled CPU) is shown when it costs a quarter of the step or more: less is the
  // noise of ranks sharing cores.
  const std::string straggler =
      m.straggler_s > m.step_s / 4
          ? strf(" | slowest rank %d@%s +%.0f ms", m.slowest_rank, m.slowest_host.c_str(), 1000 * m.straggler_s)
          : "";
  // Every rank waiting three quarters of the step or more: the transfers set the pace (a slow link), not any rank's
  // work. Less is common where a small model's steps are bound by their traffic (the tiny model across two nodes
  // waits about two thirds of its step).
  const std::string all_wait =
      m.all_wait_s > 0.75 * m.step_s ? strf(" | all ranks waiting %.0f%%", 100 * m.all_wait_s / m.step_s) : "";
  const std::string stalled =
      m.stall ? strf(" | stalled %.1f s in %s on group %s", m.stall->seconds, m.stall->op, m.stall->group) : "";
  const std::string mfu = std::isfinite(m.mfu) ? strf("%.1f%%", 100 * m.mfu) : "?";
  return strf("step %6d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %s | %.0f ms/step%s%s%s%s | ETA %s",
              m.step, m.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, mfu.c_str(), 1000 * m.step_s,
              m.bubble ? strf(" | bubble %.0f%%", 100 * *m.bubble).c_str() : "", straggler.c_str(), all_wait.c_str(),
              stalled.c_str(), format_duration(m.eta_s).c_str());
}

// The step's traffic by group and operation, the non-zero ones; evaluations and checkpoints between steps are
// outside it.
static nlohmann::ordered_json step_traffic(const StepMetrics& m) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (comm::Group g : {comm::Group::Data, comm::Group::Tensor, comm::Group::Pipeline}) {
    const Traffic& start = m.traffic_start[static_cast<int>(g)];
    const Traffic& end = m.traffic_end[static_cast<int>(g)];
    nlohmann::ordered_json ops = nlohmann::ordered_json::object();
    for (int op = 0; op < static_cast<int>(CommOp::kCount); op++)
      if (end.bytes[op] > start.bytes[op]) ops[comm_op_name(static_cast<CommOp>(op))] = end.bytes[op] - start.bytes[op];
    if (!ops.empty()) out[comm::group_name(g)] = std::move(ops);
  }
  return out;
}

JsonLine step_record(const StepMetrics& m) {
  JsonLine line;
  line.add("step", static_cast<long long>(m.step))
      .add("loss", m.loss)
      .add("lr", m.lr)
      .add("grad_norm", m.grad_norm)
      .add("tokens_per_s", m.tokens_per_s)
      .add("mfu", m.mfu)
      .add("step_s", m.step_s)
      .add("data_s", m.data_s)
      .add("compute_s", m.compute_s)
      .add("comm_s", m.comm_s)
      .add("wait_max_s", m.wait_max_s)
      .add("slowest_rank", static_cast<long long>(m.slowest_rank))
      .add("straggler_s", m.straggler_s)
      .add("all_wait_s", m.all_wait_s)
      .add("optim_s", m.optim_s)
      .add("optim_background_s", m.optim_background_s)
      .add("local_ckpt_s", m.local_ckpt_s)
      .add("skipped", static_cast<long long>(m.skipped))
      .add("tokens", m.tokens)
      .add("peak_host_bytes", static_cast<long long>(m.peak_host_bytes))
      .add("base_host_bytes", static_cast<long long>(m.base_host_bytes))
      .add("comm_bytes", step_traffic(m));
  if (m.bubble) line.add("bubble", *m.bubble).add("stage_busy", m.stage_busy);
  if (m.offload) {
    const OffloadSplit& o = *m.offload;
    line.add("offload", nlohmann::ordered_json{{"down_bytes", static_cast<long long>(o.down_bytes)},
                                               {"up_bytes", static_cast<long long>(o.up_bytes)},
                                               {"grads_wait_s", o.grads_wait},
                                               {"adamw_s", o.adamw},
                                               {"weights_wait_s", o.weights_wait},
                                               {"exposed_s", o.grads_wait + o.adamw + o.weights_wait}});
  }
  return line;
}

void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);  // a torn last line is discarded
    if (!rec.is_object() || !rec.contains("step") || !rec["step"].is_number_integer()) continue;
    const int64_t s = rec["step"].get<int64_t>();
    if (rec.contains("val_loss") ? s < step : s <= step) kept += line + "\n";
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

}  // namespace yuan
