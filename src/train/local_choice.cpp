#include "train/local_choice.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "train/local_store.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {
namespace fs = std::filesystem;
using nlohmann::json;

Chooser::Chooser(const std::vector<std::string>& listings, const std::vector<ResumeChoice::Candidate>& fs,
                 std::vector<std::string> hosts)
    : fs_(fs), hosts_(std::move(hosts)) {
  std::map<std::pair<int64_t, int64_t>, Generation> gens;
  for (const std::string& l : listings)
    for (const json& e : json::parse(l)) {
      if (e.contains("problem")) {
        warn("skipping local checkpoint %s: %s", e["path"].get<std::string>().c_str(),
             e["problem"].get<std::string>().c_str());
        continue;
      }
      const json& m = e["manifest"];
      Generation& g = gens[{m["run"].get<int64_t>(), m["step"].get<int64_t>()}];
      g.run = m["run"].get<int64_t>();
      g.step = m["step"].get<int64_t>();
      g.world = m["world"].get<int>();
      g.copies[m["rank"].get<int>()].push_back({e["holder"].get<int>(), e["own"].get<bool>(),
                                                e["path"].get<std::string>(), m});
    }
  for (auto it = gens.rbegin(); it != gens.rend(); ++it) {
    max_run_ = std::max(max_run_, it->second.run);
    for (auto& [rank, held] : it->second.copies)
      std::stable_sort(held.begin(), held.end(), [](const HeldCopy& a, const HeldCopy& b) { return a.own > b.own; });
    gens_.push_back(std::move(it->second));
  }
}

std::string Chooser::newest() const {
  for (const Generation& g : gens_)
    for (const auto& [rank, held] : g.copies)
      if (!held.empty())
        return strf("%s of run %lld, in %s on %s", step_dir_name(g.step).c_str(), static_cast<long long>(g.run),
                    fs::path(held.front().path).parent_path().c_str(),
                    hosts_[held.front().holder].c_str());
  return "";
}

json Chooser::next() {
  if (verified_) return {{"final", true}, {"assign", assign_}};
  if (fs_verified_) return {{"final", true}, {"fs", fs_[fs_next_].dir}};
  assign_ = json::array();
  const ResumeChoice::Candidate* f = fs_next_ < fs_.size() ? &fs_[fs_next_] : nullptr;
  for (Generation& g : gens_) {
    if (f && std::tie(g.run, g.step) <= std::tie(f->run, f->step)) break;
    int missing = -1;
    for (int r = 0; r < g.world && missing < 0; r++)
      if (g.copies[r].empty()) missing = r;
    if (missing >= 0) {
      report_incomplete(g, missing);
      continue;
    }
    for (int r = 0; r < g.world; r++) {
      const HeldCopy& h = g.copies[r].front();
      assign_.push_back({{"rank", r}, {"holder", h.holder}, {"own", h.own}, {"path", h.path},
                         {"manifest", h.manifest}});
    }
    current_ = &g;
    return {{"final", false}, {"assign", assign_}};
  }
  if (f) return {{"final", false}, {"fs", f->dir}};
  return {{"final", true}};
}

void Chooser::fs_verdict(const std::string& why) {
  if (why.empty()) {
    fs_verified_ = true;
    return;
  }
  warn("skipping checkpoint %s: %s", fs_[fs_next_].dir.c_str(), why.c_str());
  fs_next_++;
}

void Chooser::verdicts(const std::vector<std::string>& all) {
  verified_ = true;
  for (const std::string& v : all)
    for (const json& f : json::parse(v)) {
      verified_ = false;
      warn("skipping local checkpoint %s: %s", f["path"].get<std::string>().c_str(),
           f["why"].get<std::string>().c_str());
      std::vector<HeldCopy>& held = current_->copies[f["rank"].get<int>()];
      held.erase(std::remove_if(held.begin(), held.end(), [&](const HeldCopy& h) { return h.path == f["path"]; }),
                 held.end());
    }
}

void Chooser::report_incomplete(const Generation& g, int rank) {
  // Any copy's manifest has the world's map: not necessarily the first rank's, which next() may have left empty.
  const auto any = std::find_if(g.copies.begin(), g.copies.end(), [](const auto& c) { return !c.second.empty(); });
  if (any == g.copies.end() || reported_.count({g.run, g.step})) return;
  reported_.insert({g.run, g.step});
  const json& m = any->second.front().manifest;
  const std::vector<std::string> hosts = m["hosts"].get<std::vector<std::string>>();
  const int partner = m["partners"][rank].get<int>();
  warn("local checkpoint %s of run %lld is incomplete: rank %d's shard is on no live node (its own copy was on "
       "%s, %s); resuming from an older checkpoint",
       step_dir_name(g.step).c_str(), static_cast<long long>(g.run), rank, hosts[rank].c_str(),
       partner >= 0 ? strf("its partner copy on %s", hosts[partner].c_str()).c_str() : "it had no partner copy");
}

std::string verify_assigned(const json& assign, int me) {
  json failed = json::array();
  for (const json& a : assign) {
    if (a["holder"].get<int>() != me) continue;
    const std::string path = a["path"].get<std::string>();
    const std::string why = local_copy_problem(path, a["manifest"]);
    if (!why.empty()) failed.push_back({{"rank", a["rank"]}, {"path", path}, {"why", why}});
  }
  return failed.dump();
}

int64_t last_logged_step(const std::string& path) {
  std::ifstream in(path);
  int64_t step = -1;
  for (std::string line; std::getline(in, line);) {
    const json rec = json::parse(line, nullptr, false);  // a torn last line says nothing
    if (rec.is_object() && rec.contains("step") && rec["step"].is_number_integer()) step = rec["step"].get<int64_t>();
  }
  return step;
}

}  // namespace yuan
