#include "backend/kernel_account.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace yuan {
namespace {

using Json = nlohmann::ordered_json;

double rate_of(const AccountedOp& op, const AccountPeak& p) {
  switch (op.roof) {
    case Roof::Device: return p.bytes_per_s;
    case Roof::Link: return p.link_bytes_per_s;
    case Roof::Host: return p.host_bytes_per_s;
  }
  return 0;
}

Json number_or_null(std::optional<double> v) { return v && std::isfinite(*v) ? Json(*v) : Json(nullptr); }

Json kernel_object(const KernelTime& k, bool emulated) {
  Json j = {{"name", k.name}, {"launches", k.launches}, {"time_s", k.time_s}};
  if (!emulated) return j;
  j["touched_bytes"] = k.read_bytes + k.written_bytes;
  j["read_bytes"] = k.read_bytes;
  j["written_bytes"] = k.written_bytes;
  j["requests"] = k.requests;
  j["sectors"] = k.sectors;
  j["sector_efficiency"] = sector_efficiency(k);
  j["shared_requests"] = k.shared_requests;
  j["bank_conflicts"] = k.bank_conflicts;
  j["occupancy"] = k.occupancy;
  j["registers"] = k.registers;
  j["findings"] = k.findings;
  return j;
}

}  // namespace

double sector_efficiency(const KernelTime& k) {
  return k.sectors ? double(k.used_bytes) / (32.0 * double(k.sectors)) : 1.0;
}

KernelTime op_traffic(const AccountedOp& op) {
  KernelTime t;
  for (const KernelTime& k : op.kernels) {
    t.read_bytes += k.read_bytes;
    t.written_bytes += k.written_bytes;
    t.requests += k.requests;
    t.sectors += k.sectors;
    t.used_bytes += k.used_bytes;
    t.shared_requests += k.shared_requests;
    t.bank_conflicts += k.bank_conflicts;
    t.findings.insert(t.findings.end(), k.findings.begin(), k.findings.end());
  }
  return t;
}

Roofline roofline(const AccountedOp& op, const AccountPeak& p) {
  Roofline r;
  if (op.time_s <= 0) return r;
  r.tflops = op.flops / op.time_s / 1e12;
  r.gbps = op.ideal_bytes / op.time_s / 1e9;
  const double rate = rate_of(op, p);
  if (op.roof != Roof::Device) {
    r.bound = "link";
    if (rate > 0) r.fraction = op.ideal_bytes / rate / op.time_s;
    return r;
  }
  const double compute = p.flops > 0 ? op.flops / p.flops : 0, memory = rate > 0 ? op.ideal_bytes / rate : 0;
  r.bound = compute > memory ? "compute" : "memory";
  if (p.flops > 0 && rate > 0) r.fraction = std::max(compute, memory) / op.time_s;
  return r;
}

std::string kernel_table(const KernelReport& r) {
  double total = 0, flops = 0, bytes = 0;
  for (const AccountedOp& op : r.ops) {
    total += op.time_s;
    flops += op.flops;
    bytes += op.ideal_bytes;
  }
  size_t name_w = 2, shape_w = 5;
  for (const AccountedOp& op : r.ops) {
    name_w = std::max(name_w, op.name.size());
    shape_w = std::max(shape_w, op.shape.size());
  }
  const int nw = static_cast<int>(name_w), sw = static_cast<int>(shape_w);
  std::string out = strf("kernel account, steps %d-%d%s (%s):\n", r.first, r.last,
                         r.emulated ? ", times meaningless: emulated device" : "", r.device.c_str());
  out += strf("%-*s %-9s %-*s %7s %10s %7s %8s %8s %9s %s\n", nw, "op", "phase", sw, "shape", "calls", "time ms",
              "% steps", "TFLOP/s", "GB/s", "% roofline", "bound");
  for (const AccountedOp& op : r.ops) {
    const Roofline f = roofline(op, r.peak);
    out += strf("%-*s %-9s %-*s %7lld %10.3f %6.2f%% %8.2f %8.1f %9s %s%s\n", nw, op.name.c_str(), op.phase.c_str(),
                sw, op.shape.c_str(), static_cast<long long>(op.calls), 1e3 * op.time_s,
                r.step_s > 0 ? 100 * op.time_s / r.step_s : 0.0, f.tflops, f.gbps,
                f.fraction ? strf("%.1f%%", 100 * *f.fraction).c_str() : "-", f.bound,
                op.exempt.empty() ? "" : " (exempt)");
  }
  const double unaccounted = r.step_s > 0 ? 1 - r.busy_s / r.step_s : 0;
  out += strf("unaccounted: %.1f%% of %.3f ms of steps (%.3f ms busy on some stream: launch gaps, host waits, idle)\n",
              100 * unaccounted, 1e3 * r.step_s, 1e3 * r.busy_s);
  out += strf("total: %.3f ms of operations, %.4g TFLOP, %.4g GB ideal; peak %.4g TFLOP/s, %.4g GB/s (%s)",
              1e3 * total, flops / 1e12, bytes / 1e9, r.peak.flops / 1e12, r.peak.bytes_per_s / 1e9,
              r.peak.source.c_str());
  if (r.untimed) out += strf("\n%lld launches untimed: the event pool ran short (it grew for the next step)",
                             static_cast<long long>(r.untimed));
  return out;
}

std::string kernel_json(const KernelReport& r) {
  const auto rate = [](double v) { return v > 0 ? Json(v) : Json(nullptr); };
  Json j;
  j["device"] = r.device;
  j["emulated"] = r.emulated;
  j["times"] = r.emulated ? "meaningless: emulated device" : "measured";
  j["steps"] = {r.first, r.last};
  j["step_time_s"] = r.step_s;
  j["busy_s"] = r.busy_s;
  j["unaccounted_s"] = r.step_s - r.busy_s;
  j["unaccounted_share"] = r.step_s > 0 ? 1 - r.busy_s / r.step_s : 0.0;
  j["untimed_launches"] = r.untimed;
  j["peak"] = {{"flops", r.peak.flops},
               {"bytes_per_s", r.peak.bytes_per_s},
               {"source", r.peak.source},
               {"link_bytes_per_s", rate(r.peak.link_bytes_per_s)},
               {"host_bytes_per_s", rate(r.peak.host_bytes_per_s)},
               {"link_source", r.peak.link_source}};
  Json ops = Json::array();
  for (const AccountedOp& op : r.ops) {
    const Roofline f = roofline(op, r.peak);
    Json o = {{"name", op.name},          {"family", op.family},
              {"phase", op.phase},        {"shape", op.shape},
              {"calls", op.calls},        {"launches", op.launches},
              {"time_s", op.time_s},      {"flops", op.flops},
              {"ideal_bytes", op.ideal_bytes}, {"tflops", f.tflops},
              {"gbps", f.gbps},           {"roofline_fraction", number_or_null(f.fraction)},
              {"bound", f.bound}};
    if (!op.exempt.empty()) o["exempt"] = op.exempt;
    if (r.emulated) {
      const KernelTime t = op_traffic(op);
      o["touched_bytes"] = t.read_bytes + t.written_bytes;
      o["sector_efficiency"] = sector_efficiency(t);
    }
    Json ks = Json::array();
    for (const KernelTime& k : op.kernels) ks.push_back(kernel_object(k, r.emulated));
    o["kernels"] = std::move(ks);
    ops.push_back(std::move(o));
  }
  j["operations"] = std::move(ops);
  return j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace yuan
