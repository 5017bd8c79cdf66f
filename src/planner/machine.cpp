#include "planner/machine.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace yuan::planner {

namespace {

// One key of the format: where it lives in Machine, and the range it must be in. A single table drives the
// parser and the writer, so the two cannot drift apart.
struct Key {
  const char* section;
  const char* name;
  enum Type { Text, Kind, Count, Number } type;
  double Machine::*number = nullptr;  // Number
  int Machine::*count = nullptr;      // Count
  std::string Machine::*text = nullptr;  // Text, Kind
  bool positive = true;                  // Number: > 0 (else >= 0)
  bool fraction = false;                 // Number: also <= 1
  bool cuda_only = false;                // may be left out of a cpu machine (it keeps Machine's default)
  bool optional = false;                 // may be left out of any machine (it keeps Machine's default)
};

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"machine", "name", Key::Text, nullptr, nullptr, &Machine::name},
      {"machine", "devices_per_node", Key::Count, nullptr, &Machine::devices_per_node},
      {"machine", "nodes_per_host", Key::Count, nullptr, &Machine::nodes_per_host, nullptr, true, false, false,
       true},
      {"device", "kind", Key::Kind, nullptr, nullptr, &Machine::kind},
      {"device", "peak_flops", Key::Number, &Machine::peak_flops},
      {"device", "gemm_efficiency", Key::Number, &Machine::gemm_efficiency, nullptr, nullptr, true, true},
      {"device", "gemm_half_flops", Key::Number, &Machine::gemm_half_flops},
      {"device", "mem_bw", Key::Number, &Machine::mem_bw},
      {"device", "attention_efficiency", Key::Number, &Machine::attention_efficiency, nullptr, nullptr, true, true,
       true},
      {"device", "cudnn_attention_efficiency", Key::Number, &Machine::cudnn_attention_efficiency, nullptr, nullptr,
       false, true, false, true},
      {"device", "mem_efficiency", Key::Number, &Machine::mem_efficiency, nullptr, nullptr, true, true, true},
      {"device", "launch_s", Key::Number, &Machine::launch_s, nullptr, nullptr, false, false, true},
      {"device", "sm_count", Key::Count, nullptr, &Machine::sm_count, nullptr, true, false, true},
      {"device", "sustained_clock", Key::Number, &Machine::sustained_clock, nullptr, nullptr, true, true, true},
      {"device", "attention_flops", Key::Number, &Machine::attention_flops, nullptr, nullptr, false, false, false,
       true},
      {"device", "gelu_rate", Key::Number, &Machine::gelu_rate, nullptr, nullptr, false, false, false, true},
      {"device", "softmax_rate", Key::Number, &Machine::softmax_rate, nullptr, nullptr, false, false, false, true},
      {"device", "mem_bytes", Key::Number, &Machine::mem_bytes, nullptr, nullptr, false},
      {"device", "pcie_bw", Key::Number, &Machine::pcie_bw, nullptr, nullptr, false},
      {"host", "mem_bytes", Key::Number, &Machine::host_mem_bytes},
      {"host", "mem_bw", Key::Number, &Machine::host_mem_bw},
      {"host", "cores", Key::Count, nullptr, &Machine::host_cores},
  };
  return k;
}

// The link classes' keys, kept apart because they point into a LinkClass.
struct LinkKey {
  const char* section;
  LinkClass Machine::*link;
};
constexpr LinkKey kLinks[] = {{"link.intra", &Machine::intra}, {"link.inter", &Machine::inter}};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

bool sourced(const std::string& comment) {
  return comment.rfind("source:", 0) == 0 || comment.rfind("measured:", 0) == 0;
}

// The shortest decimal text that reads back as `v`.
std::string number_text(double v) {
  for (int precision = 6;; precision++) {
    const std::string s = strf("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v || precision >= 17) return s;
  }
}

}  // namespace

Machine parse_machine(const std::string& text, const std::string& file, MachineSources* sources) {
  Machine m;
  std::set<std::string> seen;
  std::string section;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); line++) {
    const size_t hash = raw.find('#');
    const std::string body = trim(raw.substr(0, hash));
    const std::string comment = hash == std::string::npos ? "" : trim(raw.substr(hash + 1));
    const std::string at = strf("%s:%d", file.c_str(), line);
    if (body.empty()) continue;
    if (body.front() == '[') {
      YUAN_CHECK(body.back() == ']', "%s: malformed section header '%s' (expected [name])", at.c_str(),
                 body.c_str());
      section = trim(body.substr(1, body.size() - 2));
      bool known = section == "link.intra" || section == "link.inter";
      for (const Key& k : keys()) known = known || section == k.section;
      YUAN_CHECK(known, "%s: unknown section [%s] (expected [machine], [device], [host], [link.intra] or "
                 "[link.inter])", at.c_str(), section.c_str());
      continue;
    }
    const size_t eq = body.find('=');
    YUAN_CHECK(eq != std::string::npos, "%s: '%s' is not 'key = value'", at.c_str(), body.c_str());
    const std::string name = trim(body.substr(0, eq)), value = trim(body.substr(eq + 1));
    YUAN_CHECK(!section.empty(), "%s: key '%s' before any [section]", at.c_str(), name.c_str());
    const std::string full = section + "." + name;
    YUAN_CHECK(seen.insert(full).second, "%s: key '%s' given twice", at.c_str(), full.c_str());
    YUAN_CHECK(!value.empty(), "%s: key '%s': no value", at.c_str(), full.c_str());
    const Key* key = nullptr;
    for (const Key& k : keys())
      if (section == k.section && name == k.name) key = &k;
    LinkClass* link = nullptr;
    for (const LinkKey& l : kLinks)
      if (section == l.section && (name == "latency_s" || name == "bandwidth")) link = &(m.*l.link);
    YUAN_CHECK(key || link, "%s: key '%s': unknown key", at.c_str(), full.c_str());
    if (key && key->type == Key::Text) {
      m.*key->text = value;
      continue;
    }
    if (key && key->type == Key::Kind) {
      YUAN_CHECK(value == "cpu" || value == "cuda", "%s: key '%s': '%s' is not cpu or cuda", at.c_str(),
                 full.c_str(), value.c_str());
      m.*key->text = value;
      continue;
    }
    // A number: it must say where it comes from.
    YUAN_CHECK(sourced(comment), "%s: key '%s': the number has no '# source: ...' (datasheet, URL, doc) or "
               "'# measured: ...' (how, date, host) comment", at.c_str(), full.c_str());
    if (sources) (*sources)[full] = comment;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    YUAN_CHECK(end && *end == '\0' && errno == 0 && std::isfinite(v), "%s: key '%s': '%s' is not a number",
               at.c_str(), full.c_str(), value.c_str());
    const bool positive = link ? name == "bandwidth" : key->positive;
    YUAN_CHECK(positive ? v > 0 : v >= 0, "%s: key '%s': %s must be %s", at.c_str(), full.c_str(), value.c_str(),
               positive ? "positive" : "at least 0");
    if (link) {
      (name == "latency_s" ? link->latency_s : link->bandwidth) = v;
    } else if (key->type == Key::Count) {
      YUAN_CHECK(v == std::floor(v) && v <= 1 << 20, "%s: key '%s': %s must be a whole number", at.c_str(),
                 full.c_str(), value.c_str());
      m.*key->count = static_cast<int>(v);
    } else {
      YUAN_CHECK(!key->fraction || v <= 1, "%s: key '%s': %s must be a fraction, at most 1", at.c_str(),
                 full.c_str(), value.c_str());
      m.*key->number = v;
    }
  }
  std::vector<std::string> all;
  for (const Key& k : keys())
    if (!k.optional && (!k.cuda_only || !m.cpu())) all.push_back(std::string(k.section) + "." + k.name);
  for (const LinkKey& l : kLinks)
    for (const char* n : {"latency_s", "bandwidth"}) all.push_back(std::string(l.section) + "." + n);
  for (const std::string& k : all) YUAN_CHECK(seen.count(k), "%s: key '%s' missing", file.c_str(), k.c_str());
  // A GPU's own memory and its host link are what the plan holds it to; a CPU node has neither.
  if (!m.cpu()) {
    YUAN_CHECK(m.mem_bytes > 0, "%s: key 'device.mem_bytes' must be positive for a cuda device", file.c_str());
    YUAN_CHECK(m.pcie_bw > 0, "%s: key 'device.pcie_bw' must be positive for a cuda device", file.c_str());
  }
  return m;
}

Machine read_machine(const std::string& path, MachineSources* sources) {
  std::error_code ec;
  // An ifstream opens a directory and reads it as empty: every key would be reported missing.
  YUAN_CHECK(!std::filesystem::is_directory(path, ec), "machine file %s is a directory, expected an INI file",
             path.c_str());
  std::ifstream f(path);
  YUAN_CHECK(f, "%s: cannot read the machine file", path.c_str());
  std::stringstream text;
  text << f.rdbuf();
  return parse_machine(text.str(), path, sources);
}

std::string machine_text(const Machine& m, const MachineSources& sources) {
  std::string out, section;
  const auto line = [&](const std::string& sec, const std::string& name, const std::string& value, bool number) {
    if (sec != section) out += strf("%s[%s]\n", section.empty() ? "" : "\n", sec.c_str());
    section = sec;
    const std::string full = sec + "." + name;
    std::string comment;
    if (number) {
      const auto s = sources.find(full);
      YUAN_CHECK(s != sources.end() && sourced(s->second), "machine file: key '%s' has no source ('source: ...' or "
                 "'measured: ...')", full.c_str());
      comment = "  # " + s->second;
    }
    out += strf("%-16s = %s%s\n", name.c_str(), value.c_str(), comment.c_str());
  };
  for (const Key& k : keys()) {
    // A cpu machine that did not give the key (no source for it) keeps the neutral value parse_machine gives.
    // Nor does any machine that did not give an optional one.
    if ((k.optional || (k.cuda_only && m.cpu())) && !sources.count(std::string(k.section) + "." + k.name)) continue;
    switch (k.type) {
      case Key::Text:
      case Key::Kind: line(k.section, k.name, m.*k.text, false); break;
      case Key::Count: line(k.section, k.name, std::to_string(m.*k.count), true); break;
      case Key::Number: line(k.section, k.name, number_text(m.*k.number), true); break;
    }
  }
  for (const LinkKey& l : kLinks) {
    line(l.section, "latency_s", number_text((m.*l.link).latency_s), true);
    line(l.section, "bandwidth", number_text((m.*l.link).bandwidth), true);
  }
  return out;
}

}  // namespace yuan::planner
