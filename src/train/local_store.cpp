#include "train/local_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "train/checkpoint.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/memory.h"
#include "util/sha256.h"

namespace yuan {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {
constexpr const char* kLocalFormat = "yuanlm-local-checkpoint-2";  // 2: CRC-32C file checksums
}  // namespace

std::string absolute_run_dir(const Config& cfg) {
  fs::path p = fs::absolute(cfg.run.dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "runs/x/" names the same directory as "runs/x"
  return p.string();
}

std::string step_dir_name(int64_t step) { return strf("step_%07lld", static_cast<long long>(step)); }
std::string rank_dir_name(int rank) { return strf("rank_%05d", rank); }

std::string resolve_local_dir(const Config& cfg, const std::string& host) {
  std::string dir = cfg.ckpt.local_dir.empty() ? "/dev/shm" : cfg.ckpt.local_dir;
  for (size_t at = dir.find("%h"); at != std::string::npos; at = dir.find("%h", at + host.size()))
    dir.replace(at, 2, host);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/yuanlm-" + sha256_hex(absolute_run_dir(cfg)).substr(0, 16);
}

int partner_rank(const layout::NodeMap& nodes, int rank) {
  if (nodes.nodes() < 2) return -1;
  const int n = nodes.node[rank];
  const std::vector<int> here = nodes.ranks_on(n), next = nodes.ranks_on((n + 1) % nodes.nodes());
  const size_t local = std::find(here.begin(), here.end(), rank) - here.begin();
  return next[local % next.size()];
}

size_t local_storage_needed(const layout::NodeMap& nodes, const std::vector<size_t>& own, int node) {
  size_t need = 0;
  for (int r = 0; r < static_cast<int>(own.size()); r++) {
    const int keeper = partner_rank(nodes, r);
    if (nodes.node[r] == node) need += own[r];
    if (keeper >= 0 && nodes.node[keeper] == node) need += own[r];
  }
  return 2 * need;
}

size_t own_copy_bytes(const ZeroOptimizers& opts) {
  size_t n = 0;
  for (const ZeroOptimizer* opt : saved_optimizers(opts)) n += 3 * sizeof(float) * opt->shard_size() + 4096;
  return n;
}

std::string local_dir_problem(const std::string& dir, int rank, size_t need, const std::string& node) {
  std::string problem;
  try {
    make_dirs(dir);
    const std::string probe = dir + "/" + strf(".probe_%05d", rank);
    write_file_atomic(probe, "yuanlm\n");
    fs::remove(probe);
    struct statvfs sv {};
    YUAN_CHECK(::statvfs(dir.c_str(), &sv) == 0, "cannot stat the filesystem of %s: %s", dir.c_str(),
               std::strerror(errno));
    const size_t avail = static_cast<size_t>(sv.f_bavail) * sv.f_frsize;
    if (avail < need)
      problem = strf("has %s free, and the local checkpoints of %s need %zu bytes (%s: two generations of its "
                     "ranks' own shards and of the partner copies it keeps)",
                     format_bytes(static_cast<double>(avail)).c_str(), node.c_str(), need,
                     format_bytes(static_cast<double>(need)).c_str());
  } catch (const std::exception& e) {
    problem = strf("is not writable: %s", e.what());
  }
  return problem.empty() ? "" : strf("ckpt.local_dir %s %s", dir.c_str(), problem.c_str());
}

MappedShard::MappedShard(const std::string& path, size_t count) : MappedShard(path, count, shard_file_prefix(count)) {}

MappedShard::MappedShard(const std::string& path, size_t count, const std::string& prefix)
    : name(path.substr(path.rfind('/') + 1)),
      count(count),
      bytes(prefix.size() + 3 * sizeof(float) * count),
      base(MAP_FAILED) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  YUAN_CHECK(fd >= 0, "%s: cannot create: %s", path.c_str(), std::strerror(errno));
  // Reserved, not just sized: a store into a tmpfs page that cannot be allocated would be a SIGBUS.
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == 0) base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  YUAN_CHECK(err == 0, "%s: cannot reserve %zu bytes: %s", path.c_str(), bytes, std::strerror(err));
  YUAN_CHECK(base != MAP_FAILED, "%s: cannot map: %s", path.c_str(), std::strerror(map_errno));
  std::memcpy(base, prefix.data(), prefix.size());
  tensors = reinterpret_cast<float*>(static_cast<char*>(base) + prefix.size());  // the prefix is 8-byte padded
}

MappedShard::~MappedShard() { ::munmap(base, bytes); }

void LocalSlot::create(const std::string& at, const std::vector<std::pair<std::string, size_t>>& shards) {
  files.clear();
  fs::remove_all(at);
  make_dirs(at);
  dir = at;
  for (const auto& [file, count] : shards) files.push_back(std::make_unique<MappedShard>(at + "/" + file, count));
}

void LocalSlot::move_to(const std::string& at) {
  fs::remove_all(at);
  fs::rename(dir, at);
  dir = at;
}

void LocalSlot::seal(const std::string& final_dir, const std::string& manifest) {
  for (const auto& f : files)
    YUAN_CHECK(::msync(f->base, f->bytes, MS_SYNC) == 0, "%s: msync failed: %s", dir.c_str(), std::strerror(errno));
  write_file_atomic(dir + "/manifest.json", manifest);
  fs::remove_all(final_dir);
  fs::rename(dir, final_dir);
  dir = final_dir;
}

LocalStore::LocalStore(std::string dir, int rank, std::vector<int> senders)
    : dir_(std::move(dir)), rank_(rank), senders_(std::move(senders)) {}

void LocalStore::prepare(int64_t step, bool reuse, bool reuse_partners,
                         const std::vector<std::pair<std::string, size_t>>& shards) {
  const std::string name = step_dir_name(step);
  const std::string tmp = dir_ + "/" + name + "/.tmp_" + rank_dir_name(rank_);
  LocalSlot& slot = slots_[1 - last_];
  std::vector<LocalSlot>& partners = partner_slots_[1 - last_];
  try {
    make_dirs(dir_ + "/" + name);
    if (reuse && !slot.dir.empty()) slot.move_to(tmp);
    else slot.create(tmp, shards);
    for (size_t i = 0; i < partners.size(); i++) {
      LocalSlot& s = partners[i];
      if (!reuse_partners || s.dir.empty() || !fs::exists(s.dir)) {
        s = LocalSlot();
        continue;
      }
      make_dirs(partner_dir(step));
      s.move_to(partner_dir(step) + "/.tmp_" + rank_dir_name(senders_[i]));
    }
  } catch (...) {
    slot = LocalSlot();
    partners.clear();
    throw;
  }
  last_ = 1 - last_;
}

std::vector<uint32_t> LocalStore::copy_in(const std::vector<ZeroOptimizer*>& saved) {
  std::vector<uint32_t> crcs;
  for (size_t i = 0; i < saved.size(); i++) {
    ZeroOptimizer& opt = *saved[i];
    MappedShard& f = *slots_[last_].files[i];
    uint32_t crc = crc32c(0, f.base, f.bytes - 3 * sizeof(float) * f.count);  // the prefix the file was made with
    const float* const src[3] = {opt.master(), opt.exp_avg(), opt.exp_avg_sq()};
    for (int t = 0; t < 3; t++) crc = crc32c_copy(crc, f.tensors + t * f.count, src[t], f.count * sizeof(float));
    crcs.push_back(crc);
  }
  return crcs;
}

void LocalStore::seal_own(int64_t step, const std::string& manifest) {
  slots_[last_].seal(dir_ + "/" + step_dir_name(step) + "/" + rank_dir_name(rank_), manifest);
}

LocalSlot& LocalStore::partner_files(size_t i, int64_t step, const json& manifest) {
  std::vector<LocalSlot>& slots = partner_slots_[last_];
  slots.resize(senders_.size());
  LocalSlot& s = slots[i];
  const std::string tmp = partner_dir(step) + "/.tmp_" + rank_dir_name(senders_[i]);
  const json& files = manifest["files"];
  bool fits = s.dir == tmp && s.files.size() == files.size();
  for (size_t f = 0; fits && f < s.files.size(); f++)
    fits = s.files[f]->name == files[f]["name"].get<std::string>() && s.files[f]->count == files[f]["count"].get<size_t>();
  if (!fits) {
    std::vector<std::pair<std::string, size_t>> shards;
    for (const json& f : files) shards.emplace_back(f["name"].get<std::string>(), f["count"].get<size_t>());
    s.create(tmp, shards);
  }
  return s;
}

void LocalStore::seal_partner(size_t i, int64_t step, const std::string& manifest) {
  partner_slots_[last_][i].seal(partner_dir(step) + "/" + rank_dir_name(senders_[i]), manifest);
}

void LocalStore::drop_older(const std::string& keep, const std::string& next) const {
  for (const std::string& root : {dir_, dir_ + "/partner"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && name != keep && name != next) fs::remove_all(e.path(), ec);
    }
  }
}

void LocalStore::release() {
  for (LocalSlot& slot : slots_) slot.files.clear();
  for (std::vector<LocalSlot>& slots : partner_slots_) slots.clear();
}

std::string local_manifest(const ordered_json& fields) {
  ordered_json m = {{"format", kLocalFormat}};
  for (const auto& [key, value] : fields.items()) m[key] = value;
  m["sha256"] = json_checksum(json::parse(m.dump()));
  return m.dump(2) + "\n";
}

namespace {

// The copies under `root` (a job's directory, or its partner/ directory), in path order.
std::vector<std::string> copy_paths(const std::string& root) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& step : fs::directory_iterator(root, ec)) {
    if (step.path().filename().string().rfind("step_", 0) != 0) continue;
    std::error_code ec2;
    for (const auto& copy : fs::directory_iterator(step.path(), ec2))
      if (copy.path().filename().string().rfind("rank_", 0) == 0) paths.push_back(copy.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The manifest of the copy at `path`, checked (format, own sha256, model); null when it is another job's.
json read_manifest(const Config& cfg, const std::string& path, const std::string& run_dir) {
  const std::string what = "local checkpoint " + path + ": manifest.json";
  const json m = read_json_object(path + "/manifest.json", what);
  YUAN_CHECK(json_field<std::string>(m, "format", what) == kLocalFormat, "%s: format is not %s", what.c_str(),
             kLocalFormat);
  YUAN_CHECK(json_field<std::string>(m, "sha256", what) == json_checksum(m),
             "%s does not match its own sha256: it was changed after it was written", what.c_str());
  if (json_field<std::string>(m, "run_dir", what) != run_dir) return nullptr;  // another job's, in a shared dir
  YUAN_CHECK(json_field<size_t>(m, "n_params", what) == ParamLayout(cfg.model).total(),
             "%s: %zu parameters, the model has %zu", what.c_str(), m["n_params"].get<size_t>(),
             ParamLayout(cfg.model).total());
  for (const char* key : {"step", "run", "world", "rank"}) json_field<int64_t>(m, key, what);
  return m;
}

}  // namespace

json list_local_copies(const Config& cfg, const std::string& dir, int holder) {
  json out = json::array();
  const std::string run_dir = absolute_run_dir(cfg);
  for (const bool own : {true, false})
    for (const std::string& path : copy_paths(own ? dir : dir + "/partner")) {
      try {
        const json m = read_manifest(cfg, path, run_dir);
        if (!m.is_null()) out.push_back({{"holder", holder}, {"own", own}, {"path", path}, {"manifest", m}});
      } catch (const std::exception& e) {
        out.push_back({{"path", path}, {"problem", e.what()}});
      }
    }
  return out;
}

std::string local_copy_problem(const std::string& path, const json& manifest) {
  try {
    for (const json& f : manifest["files"]) {
      const std::string file = path + "/" + f["name"].get<std::string>();
      YUAN_CHECK(fs::exists(file), "%s is missing", file.c_str());
      YUAN_CHECK(crc32c_file(file) == f["crc32c"].get<std::string>(), "%s does not match its checksum", file.c_str());
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace yuan
