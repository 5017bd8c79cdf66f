#include "train/local_ckpt.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "parallel/watchdog.h"
#include "parallel/world.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/safetensors.h"
#include "util/sha256.h"

namespace yuan {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr const char* kLocalFormat = "yuanlm-local-checkpoint-2";  // 2: CRC-32C file checksums
constexpr size_t kChunk = size_t{1} << 28;  // floats per MPI message: counts are ints

std::string step_dir_name(int64_t step) { return strf("step_%07lld", static_cast<long long>(step)); }
std::string rank_dir_name(int rank) { return strf("rank_%05d", rank); }

std::string absolute_run_dir(const Config& cfg) {
  fs::path p = fs::absolute(cfg.run.dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "runs/x/" names the same directory as "runs/x"
  return p.string();
}

// Posts the sends (or receives) of n floats at p as messages of at most kChunk floats, in order, on one tag.
void post_floats(bool send, float* p, size_t n, int peer, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  for (size_t at = 0; at < n; at += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - at));
    reqs.emplace_back();
    if (send) MPI_CHECK(MPI_Isend(p + at, count, MPI_FLOAT, peer, tag, comm, &reqs.back()));
    else MPI_CHECK(MPI_Irecv(p + at, count, MPI_FLOAT, peer, tag, comm, &reqs.back()));
  }
}

// Waits for `reqs` until `deadline` (now_seconds()); false, with the requests still pending cancelled and freed,
// when it passed first. Polls, so that the main thread's MPI calls go on beside it.
bool wait_until(std::vector<MPI_Request>& reqs, double deadline) {
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return true;
    if (now_seconds() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request& r : reqs)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  return false;
}

// Seals a copy written into `tmp`: its manifest, then the rename to `final_dir` (a copy of the same step from an
// abandoned timeline is superseded).
void publish(const std::string& tmp, const std::string& final_dir, const std::string& manifest) {
  write_file_atomic(tmp + "/manifest.json", manifest);
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
}

// The bytes a rank's own copy takes (its shard files; the headers are small).
size_t own_bytes(const ZeroOptimizers& opts) {
  size_t n = 0;
  for (const ZeroOptimizer* opt : saved_optimizers(opts)) n += 3 * sizeof(float) * opt->shard_size() + 4096;
  return n;
}

}  // namespace

std::string resolve_local_dir(const Config& cfg, const std::string& host) {
  std::string dir = cfg.ckpt.local_dir.empty() ? "/dev/shm" : cfg.ckpt.local_dir;
  for (size_t at = dir.find("%h"); at != std::string::npos; at = dir.find("%h", at + host.size()))
    dir.replace(at, 2, host);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/yuanlm-" + sha256_hex(absolute_run_dir(cfg)).substr(0, 16);
}

int partner_rank(const parallel::NodeMap& nodes, int rank) {
  if (nodes.nodes() < 2) return -1;
  const int n = nodes.node[rank];
  const std::vector<int> here = nodes.ranks_on(n), next = nodes.ranks_on((n + 1) % nodes.nodes());
  const size_t local = std::find(here.begin(), here.end(), rank) - here.begin();
  return next[local % next.size()];
}

size_t local_storage_needed(const parallel::NodeMap& nodes, const std::vector<size_t>& own, int node) {
  size_t need = 0;
  for (int r = 0; r < static_cast<int>(own.size()); r++) {
    const int keeper = partner_rank(nodes, r);
    if (nodes.node[r] == node) need += own[r];
    if (keeper >= 0 && nodes.node[keeper] == node) need += own[r];
  }
  return 2 * need;
}

LocalTier::LocalTier(const Config& cfg, const ZeroOptimizers& opts)
    : run_dir_(absolute_run_dir(cfg)), n_params_(ParamLayout(cfg.model).total()), timeout_s_(cfg.dist.timeout_s) {
  const parallel::WorldInfo& w = parallel::world();
  const parallel::NodeMap& nodes = parallel::node_map();
  rank_ = w.rank;
  for (int r = 0; r < w.size; r++) partners_.push_back(partner_rank(nodes, r));
  dir_ = resolve_local_dir(cfg, w.host);
  partner_ = partner_rank(nodes, w.rank);
  for (int r = 0; r < w.size; r++)
    if (partner_rank(nodes, r) == w.rank) senders_.push_back(r);
  if (partner_ >= 0)
    partner_label_ = strf("rank %d on %s", partner_, nodes.label(nodes.node[partner_]).c_str());
  {
    parallel::Waiting wait("comm_dup", "world");
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  }
  if (const char* hook = std::getenv("YUANLM_PARTNER_SILENT")) silent_ = std::atoi(hook) == w.rank;
  if (const char* hook = std::getenv("YUANLM_KILL_AFTER_SEAL"); hook && w.rank == 0)
    kill_after_seal_ = std::atoll(hook);

  // What every rank keeps, so that each checks its node's directory for its ranks and their partners' copies.
  std::vector<unsigned long long> all(w.size);
  unsigned long long mine = own_bytes(opts);
  {
    parallel::Waiting wait("local checkpoint sizes", "world");
    MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm_));
  }
  const size_t need = local_storage_needed(nodes, std::vector<size_t>(all.begin(), all.end()), w.node);
  std::string problem;
  try {
    make_dirs(dir_);
    const std::string probe = dir_ + "/" + strf(".probe_%05d", w.rank);
    write_file_atomic(probe, "yuanlm\n");
    fs::remove(probe);
    struct statvfs sv {};
    YUAN_CHECK(::statvfs(dir_.c_str(), &sv) == 0, "cannot stat the filesystem of %s: %s", dir_.c_str(),
               std::strerror(errno));
    const size_t avail = static_cast<size_t>(sv.f_bavail) * sv.f_frsize;
    if (avail < need)
      problem = strf("has %s free, and the local checkpoints of %s need %zu bytes (%s: two generations of its "
                     "ranks' own shards and of the partner copies it keeps)",
                     format_bytes(static_cast<double>(avail)).c_str(), nodes.label(w.node).c_str(), need,
                     format_bytes(static_cast<double>(need)).c_str());
  } catch (const std::exception& e) {
    problem = strf("is not writable: %s", e.what());
  }
  if (!problem.empty()) problem = strf("ckpt.local_dir %s %s", dir_.c_str(), problem.c_str());
  problem = parallel::first_problem(problem);
  if (!problem.empty()) throw Error(problem, true);

  for (const ZeroOptimizer* opt : saved_optimizers(opts)) files_.push_back(shard_file_name(w.rank, *opt));
  say("local checkpoints every %d steps in %s on every node (rank 0: %s; %s)", cfg.ckpt.local_every, dir_.c_str(),
      format_bytes(static_cast<double>(mine)).c_str(),
      partner_ >= 0 ? strf("its partner copy on %s", partner_label_.c_str()).c_str() : "no partner copy");
  if (nodes.nodes() < 2)
    warn("ckpt.local_every: the job runs on one node, so there are no partner copies: a rank's local checkpoint is "
         "only in its own node's %s", dir_.c_str());
  if (!w.thread_multiple)
    warn("ckpt.local_every: MPI has no MPI_THREAD_MULTIPLE, so local checkpoints are written in the training "
         "thread, not beside it");
}

LocalTier::~LocalTier() {
  if (writer_.joinable()) writer_.join();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// A shard file of a copy, mapped: of the own copy, whose tensors the training thread copies into it (checksummed on
// the way) and which is sent to the partner from it; or of a partner's copy, received into it. It stays mapped from
// one generation to the one after the next, which overwrites it in place, so the copy costs no page faults: on the
// 2-core VM (2026-11-27) 750 MB cost 0.10 s of CPU into a file mapped before, 0.6 s into a new mapping of the same
// tmpfs pages and 1.5 s into new pages.
struct LocalTier::MappedShard {
  MappedShard(const std::string& path, size_t count) : MappedShard(path, count, shard_file_prefix(count)) {}
  MappedShard(const std::string& path, size_t count, const std::string& prefix)
      : name(path.substr(path.rfind('/') + 1)), count(count), bytes(prefix.size() + 3 * sizeof(float) * count) {
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
  ~MappedShard() { ::munmap(base, bytes); }
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const std::string name;  // in its directory
  const size_t count;       // values per tensor
  const size_t bytes;
  void* base = MAP_FAILED;
  float* tensors = nullptr;  // master, exp_avg, exp_avg_sq, one after another
};

void LocalTier::Slot::create(const std::string& at, const std::vector<std::pair<std::string, size_t>>& shards) {
  files.clear();
  fs::remove_all(at);
  make_dirs(at);
  dir = at;
  for (const auto& [file, count] : shards) files.push_back(std::make_unique<MappedShard>(at + "/" + file, count));
}

void LocalTier::Slot::move_to(const std::string& at) {
  fs::remove_all(at);
  fs::rename(dir, at);
  dir = at;
}

void LocalTier::Slot::sync() const {
  for (const auto& f : files)
    YUAN_CHECK(::msync(f->base, f->bytes, MS_SYNC) == 0, "%s: msync failed: %s", dir.c_str(), std::strerror(errno));
}

// Before generation `name` is written: the partner copies this rank keeps of the generation before the previous
// are renamed into this generation's .tmp_ directories when that generation is being dropped (the previous one is
// complete everywhere), so that the exchange receives straight into their pages; else they are let go (their
// files stay, as they may hold the last complete generation, until a later generation drops them).
void LocalTier::take_partner_files(const std::string& name, bool drop) {
  std::vector<Slot>& slots = partner_slots_[1 - last_];
  for (size_t i = 0; i < slots.size(); i++) {
    Slot& s = slots[i];
    if (!drop || !exchanging_ || s.dir.empty() || !fs::exists(s.dir)) {
      s = Slot();
      continue;
    }
    const std::string parent = dir_ + "/partner/" + name, tmp = parent + "/.tmp_" + rank_dir_name(senders_[i]);
    make_dirs(parent);
    s.move_to(tmp);
  }
}

void LocalTier::save(const TrainState& st, const ZeroOptimizers& opts) {
  if (writer_.joinable()) writer_.join();  // the only wait the step has: the previous write still going
  const std::string name = step_dir_name(st.step);
  const std::string tmp = dir_ + "/" + name + "/.tmp_" + rank_dir_name(rank_);
  // Once the previous generation is complete on every rank, the older ones (and copies of abandoned timelines) go,
  // and this one takes over the files of the one before the previous: its slot's directory is renamed to this
  // one's .tmp_ directory before any rank of the node drops the older generations.
  const bool complete = parallel::allreduce_max(ok_ ? 0.0 : 1.0) == 0.0;
  const bool drop = !previous_.empty() && complete;
  const std::vector<ZeroOptimizer*> saved = saved_optimizers(opts);
  Slot& slot = slots_[1 - last_];
  std::string problem;
  try {
    make_dirs(dir_ + "/" + name);
    if (drop && !slot.dir.empty()) {
      slot.move_to(tmp);
    } else {  // the generation in the slot (if any) may be the last complete one: new files
      std::vector<std::pair<std::string, size_t>> shards;
      for (size_t i = 0; i < saved.size(); i++) shards.emplace_back(files_[i], saved[i]->shard_size());
      slot.create(tmp, shards);
    }
    take_partner_files(name, drop);
  } catch (const std::exception& e) {
    problem = e.what();
    slot.files.clear();
    slot.dir.clear();
    partner_slots_[1 - last_].clear();
  }
  if (drop) parallel::barrier();
  if (drop && parallel::world().local_rank == 0) drop_older(previous_, name);
  previous_ = name;
  ok_ = false;
  if (!problem.empty()) {
    warn_all("local checkpoint %s not written: %s", name.c_str(), problem.c_str());
    return;
  }
  last_ = 1 - last_;

  // The one pass over the optimizer state the checkpoint makes in the step: each tensor copied into its file and
  // checksummed while it is in registers (the update cannot run meanwhile; the writer thread only seals the copy).
  ordered_json files = ordered_json::array();
  for (size_t i = 0; i < saved.size(); i++) {
    ZeroOptimizer& opt = *saved[i];
    MappedShard& f = *slot.files[i];
    uint32_t crc = crc32c(0, f.base, f.bytes - 3 * sizeof(float) * f.count);  // the prefix the file was made with
    const float* const src[3] = {opt.master(), opt.exp_avg(), opt.exp_avg_sq()};
    for (int t = 0; t < 3; t++) crc = crc32c_copy(crc, f.tensors + t * f.count, src[t], f.count * sizeof(float));
    files.push_back(shard_entry(opt, files_[i]));
    files.back()["crc32c"] = crc32c_hex(crc);
  }
  const parallel::WorldInfo& w = parallel::world();
  ordered_json m = {{"format", kLocalFormat},
                    {"step", st.step},
                    {"run", st.run},
                    {"next_sample", st.next_sample},
                    {"adam_step", opts.all().front()->adam_step()},
                    {"world", w.size},
                    {"rank", w.rank},
                    {"host", w.host},
                    {"run_dir", run_dir_},
                    {"n_params", n_params_},
                    {"hosts", parallel::world_hosts()},
                    {"partners", partners_},
                    {"files", files}};
  m["sha256"] = json_checksum(json::parse(m.dump()));
  pending_.emplace(st.step, m.dump(2) + "\n");
}

void LocalTier::seal() {
  if (!pending_) return;
  auto [step, manifest] = std::move(*pending_);
  pending_.reset();
  if (parallel::world().thread_multiple)
    writer_ = std::thread([this, step = step, manifest = std::move(manifest)] { write(step, manifest); });
  else
    write(step, manifest);
}

void LocalTier::write(int64_t step, const std::string& manifest) {
  const std::string name = step_dir_name(step);
  Slot& slot = slots_[last_];
  try {
    slot.sync();
    const std::string final_dir = dir_ + "/" + name + "/" + rank_dir_name(rank_);
    publish(slot.dir, final_dir, manifest);
    slot.dir = final_dir;
    if (step == kill_after_seal_) std::raise(SIGKILL);
    // Once partner copies have stopped for this run (a partner that did not answer), the own copy is all a
    // generation gets: complete when written, so that older generations still go and node memory stays bounded.
    ok_ = exchange(step, manifest) || !exchanging_ || silent_;
  } catch (const std::exception& e) {  // the filesystem tier still holds: training goes on
    warn_all("local checkpoint %s not written: %s", name.c_str(), e.what());
    ok_ = false;
  }
}

// Sends this rank's copy (the sealed manifest and the snapshot) to its partner and keeps the copies of the ranks it
// is partner of, within timeout_s_; true when both went through. A partner that does not answer in time is warned
// about, and the exchanges stop for the rest of the run (what was posted to it may never complete).
bool LocalTier::exchange(int64_t step, const std::string& manifest) {
  if (partner_ < 0) return true;
  if (!exchanging_ || silent_) return false;
  const double deadline = now_seconds() + timeout_s_;
  const int tag = static_cast<int>(step % 8192) * 3;  // a late message of another generation never matches
  const Slot& slot = slots_[last_];
  size_t total = 0;
  for (const auto& f : slot.files) total += 3 * f->count;
  // Header: the manifest's length and the floats that follow it.
  unsigned long long head[2] = {manifest.size(), total};
  std::vector<std::array<unsigned long long, 2>> heads(senders_.size());
  std::vector<MPI_Request> reqs;
  auto fail = [&](const std::string& who) {
    warn_all("local checkpoint %s: %s did not complete the partner exchange within %.0f s (dist.timeout_s); no more "
             "partner copies in this run, the filesystem checkpoint still holds",
             step_dir_name(step).c_str(), who.c_str(), timeout_s_);
    exchanging_ = false;
    return false;
  };
  for (size_t i = 0; i < senders_.size(); i++) {
    reqs.emplace_back();
    MPI_CHECK(MPI_Irecv(heads[i].data(), 2, MPI_UNSIGNED_LONG_LONG, senders_[i], tag, comm_, &reqs.back()));
  }
  reqs.emplace_back();
  MPI_CHECK(MPI_Isend(head, 2, MPI_UNSIGNED_LONG_LONG, partner_, tag, comm_, &reqs.back()));
  reqs.emplace_back();
  MPI_CHECK(MPI_Isend(manifest.data(), static_cast<int>(manifest.size()), MPI_CHAR, partner_, tag + 1, comm_,
                      &reqs.back()));
  for (const auto& f : slot.files) post_floats(true, f->tensors, 3 * f->count, partner_, tag + 2, comm_, reqs);
  std::vector<MPI_Request> sends(reqs.begin() + senders_.size(), reqs.end());
  std::vector<MPI_Request> head_reqs(reqs.begin(), reqs.begin() + senders_.size());
  auto lost_sender = [&] {
    wait_until(sends, 0);  // cancels them
    return fail(strf("a rank it keeps copies of (ranks %s)", parallel::ranks_text(senders_).c_str()));
  };
  if (!wait_until(head_reqs, deadline)) return lost_sender();
  std::vector<std::string> texts(senders_.size());
  std::vector<MPI_Request> recvs;
  for (size_t i = 0; i < senders_.size(); i++) {
    texts[i].resize(heads[i][0]);
    recvs.emplace_back();
    MPI_CHECK(MPI_Irecv(texts[i].data(), static_cast<int>(texts[i].size()), MPI_CHAR, senders_[i], tag + 1, comm_,
                        &recvs.back()));
  }
  if (!wait_until(recvs, deadline)) return lost_sender();
  // The floats come as the sender posted them, one run of messages per saved optimizer (a file of the manifest):
  // the receives must be cut the same way, or a message would land in a receive sized for another. Each copy goes
  // straight into mapped files: those take_partner_files renamed into place where they fit, else new ones.
  std::vector<Slot>& slots = partner_slots_[last_];
  slots.resize(senders_.size());
  const std::string parent = dir_ + "/partner/" + step_dir_name(step);
  recvs.clear();
  for (size_t i = 0; i < senders_.size(); i++) {
    const json m = json::parse(texts[i]);
    size_t total = 0;
    for (const json& f : m["files"]) total += 3 * f["count"].get<size_t>();
    YUAN_CHECK(total == heads[i][1], "local checkpoint %s: rank %d's copy holds %llu values, its manifest lists %zu",
               step_dir_name(step).c_str(), senders_[i], heads[i][1], total);
    Slot& s = slots[i];
    const std::string tmp = parent + "/.tmp_" + rank_dir_name(senders_[i]);
    bool fits = s.dir == tmp && s.files.size() == m["files"].size();
    for (size_t f = 0; fits && f < s.files.size(); f++)
      fits = s.files[f]->name == m["files"][f]["name"].get<std::string>() &&
             s.files[f]->count == m["files"][f]["count"].get<size_t>();
    if (!fits) {
      std::vector<std::pair<std::string, size_t>> shards;
      for (const json& f : m["files"]) shards.emplace_back(f["name"].get<std::string>(), f["count"].get<size_t>());
      s.create(tmp, shards);
    }
    for (const auto& f : s.files) post_floats(false, f->tensors, 3 * f->count, senders_[i], tag + 2, comm_, recvs);
  }
  if (!wait_until(recvs, deadline)) return lost_sender();
  if (!wait_until(sends, deadline)) return fail("its partner, " + partner_label_);
  for (size_t i = 0; i < senders_.size(); i++) {
    Slot& s = slots[i];
    s.sync();
    const std::string final_dir = parent + "/" + rank_dir_name(senders_[i]);
    publish(s.dir, final_dir, texts[i]);
    s.dir = final_dir;
  }
  return true;
}

// On a node's first rank: removes every generation but `keep` (complete everywhere) and `next` (being written).
void LocalTier::drop_older(const std::string& keep, const std::string& next) const {
  for (const std::string& root : {dir_, dir_ + "/partner"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && name != keep && name != next) fs::remove_all(e.path(), ec);
    }
  }
}

void LocalTier::finish() {
  if (writer_.joinable()) writer_.join();
  pending_.reset();
  for (Slot& slot : slots_) slot.files.clear();  // their pages go with the files
  for (std::vector<Slot>& slots : partner_slots_) slots.clear();
}

void remove_local_checkpoints(const Config& cfg) {
  parallel::barrier();  // no rank of the node is still writing
  const parallel::WorldInfo& w = parallel::world();
  if (w.local_rank != 0) return;
  std::error_code ec;
  fs::remove_all(resolve_local_dir(cfg, w.host), ec);  // the job's own: ckpt.local_dir may hold other jobs'
}

namespace {

// One copy of an old rank's shards that a node holds: read by `holder`, the node's first rank.
struct Held {
  int holder = 0;
  bool own = true;  // the rank's own copy, not a partner copy
  std::string path;
  json manifest;
};

// A node's first rank: the copies its directory holds, each as {"holder", "own", "path", "manifest"}, or
// {"path", "problem"} when its manifest does not check (unsealed, changed, another job's or model's).
json list_node(const Config& cfg, const std::string& dir, int me) {
  json out = json::array();
  const std::string run_dir = absolute_run_dir(cfg);
  for (const bool own : {true, false}) {
    const std::string root = own ? dir : dir + "/partner";
    std::error_code ec;
    std::vector<std::string> paths;
    for (const auto& step : fs::directory_iterator(root, ec)) {
      if (step.path().filename().string().rfind("step_", 0) != 0) continue;
      std::error_code ec2;
      for (const auto& copy : fs::directory_iterator(step.path(), ec2))
        if (copy.path().filename().string().rfind("rank_", 0) == 0) paths.push_back(copy.path().string());
    }
    std::sort(paths.begin(), paths.end());
    for (const std::string& path : paths) {
      const std::string what = "local checkpoint " + path + ": manifest.json";
      try {
        const json m = read_json_object(path + "/manifest.json", what);
        YUAN_CHECK(json_field<std::string>(m, "format", what) == kLocalFormat, "%s: format is not %s", what.c_str(),
                   kLocalFormat);
        YUAN_CHECK(json_field<std::string>(m, "sha256", what) == json_checksum(m),
                   "%s does not match its own sha256: it was changed after it was written", what.c_str());
        if (json_field<std::string>(m, "run_dir", what) != run_dir) continue;  // another job's, in a shared dir
        YUAN_CHECK(json_field<size_t>(m, "n_params", what) == ParamLayout(cfg.model).total(),
                   "%s: %zu parameters, the model has %zu", what.c_str(), m["n_params"].get<size_t>(),
                   ParamLayout(cfg.model).total());
        for (const char* key : {"step", "run", "world", "rank"}) json_field<int64_t>(m, key, what);
        out.push_back({{"holder", me}, {"own", own}, {"path", path}, {"manifest", m}});
      } catch (const std::exception& e) {
        out.push_back({{"path", path}, {"problem", e.what()}});
      }
    }
  }
  return out;
}

// The copies of one (run, step), by old rank.
struct Generation {
  int64_t run = 0, step = 0;
  int world = 0;
  std::map<int, std::vector<Held>> copies;
};

// Rank 0's choice between the generations the nodes hold and run.dir/ckpt's checkpoints: the newest complete
// generation when it is newer than the newest filesystem checkpoint not yet refused (the filesystem's wins a tie),
// else that checkpoint; whichever is next is verified in a round of its own (a generation's copies by their
// holders, a filesystem checkpoint by every rank), and what fails is dropped and the choice made again. So the
// filesystem's checkpoints are hashed only when node memory holds nothing newer.
class Chooser {
 public:
  Chooser(const std::vector<std::string>& listings, const std::vector<ResumeChoice::Candidate>& fs) : fs_(fs) {
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
      for (auto& [rank, held] : it->second.copies)  // own copies first: the partner's are the spare
        std::stable_sort(held.begin(), held.end(), [](const Held& a, const Held& b) { return a.own > b.own; });
      gens_.push_back(std::move(it->second));
    }
  }
  int64_t max_run() const { return max_run_; }
  // The newest generation held, complete or not, with where one of its copies is ("" when none).
  std::string newest() const {
    for (const Generation& g : gens_)
      for (const auto& [rank, held] : g.copies)
        if (!held.empty())
          return strf("%s of run %lld, in %s on %s", step_dir_name(g.step).c_str(), static_cast<long long>(g.run),
                      fs::path(held.front().path).parent_path().c_str(),
                      parallel::world_hosts()[held.front().holder].c_str());
    return "";
  }

  // The next round: {"final": true, "assign": [...]} to load the generation assigned, {"final": true, "fs": DIR}
  // to load a filesystem checkpoint, {"final": true} to start from initialisation; {"final": false, "assign":
  // [...]} or {"final": false, "fs": DIR} to verify.
  json next() {
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
        const Held& h = g.copies[r].front();
        assign_.push_back({{"rank", r}, {"holder", h.holder}, {"own", h.own}, {"path", h.path},
                           {"manifest", h.manifest}});
      }
      current_ = &g;
      return {{"final", false}, {"assign", assign_}};
    }
    if (f) return {{"final", false}, {"fs", f->dir}};
    return {{"final", true}};
  }

  // Every rank's verdict on the round's filesystem checkpoint (checkpoint_problem's).
  void fs_verdict(const std::string& why) {
    if (why.empty()) {
      fs_verified_ = true;
      return;
    }
    warn("skipping checkpoint %s: %s", fs_[fs_next_].dir.c_str(), why.c_str());
    fs_next_++;
  }

  // The holders' verdicts on the round's copies (JSON arrays of {"rank", "path", "why"}).
  void verdicts(const std::vector<std::string>& all) {
    verified_ = true;
    for (const std::string& v : all)
      for (const json& f : json::parse(v)) {
        verified_ = false;
        warn("skipping local checkpoint %s: %s", f["path"].get<std::string>().c_str(),
             f["why"].get<std::string>().c_str());
        std::vector<Held>& held = current_->copies[f["rank"].get<int>()];
        held.erase(std::remove_if(held.begin(), held.end(), [&](const Held& h) { return h.path == f["path"]; }),
                   held.end());
      }
  }

 private:
  void report_incomplete(const Generation& g, int rank) {
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

  std::vector<ResumeChoice::Candidate> fs_;  // newest first
  size_t fs_next_ = 0;                       // the newest not refused
  bool fs_verified_ = false;
  std::vector<Generation> gens_;  // newest first
  Generation* current_ = nullptr;
  json assign_;
  bool verified_ = false;
  int64_t max_run_ = 0;
  std::set<std::pair<int64_t, int64_t>> reported_;
};

// This rank's share of a round: the copies it holds, each file checked against its CRC-32C.
std::string verify_mine(const json& assign, int me) {
  json failed = json::array();
  for (const json& a : assign) {
    if (a["holder"].get<int>() != me) continue;
    const std::string path = a["path"].get<std::string>();
    try {
      for (const json& f : a["manifest"]["files"]) {
        const std::string file = path + "/" + f["name"].get<std::string>();
        YUAN_CHECK(fs::exists(file), "%s is missing", file.c_str());
        YUAN_CHECK(crc32c_file(file) == f["crc32c"].get<std::string>(), "%s does not match its checksum",
                   file.c_str());
      }
    } catch (const std::exception& e) {
      failed.push_back({{"rank", a["rank"]}, {"path", path}, {"why", e.what()}});
    }
  }
  return failed.dump();
}

// The step of the last record in run.dir/metrics.jsonl: where the previous run got to (-1: no record).
int64_t last_logged_step(const std::string& path) {
  std::ifstream in(path);
  int64_t step = -1;
  for (std::string line; std::getline(in, line);) {
    const json rec = json::parse(line, nullptr, false);  // a torn last line says nothing
    if (rec.is_object() && rec.contains("step") && rec["step"].is_number_integer()) step = rec["step"].get<int64_t>();
  }
  return step;
}

// Every new rank's optimizers' wanted runs, by world rank, then optimizer.
using Runs = std::vector<ParamLayout::Run>;
std::vector<std::vector<Runs>> gather_wants(const Config& cfg, const ZeroOptimizers& opts) {
  json mine = json::array();
  for (const auto& opt : opts.all()) {
    json runs = json::array();
    for (const ParamLayout::Run& r : wanted_runs(cfg.model, *opt)) runs.push_back({r.local, r.global, r.count});
    mine.push_back(runs);
  }
  std::string joined;
  for (const std::string& s : parallel::gather_strings(mine.dump())) joined += (joined.empty() ? "[" : ",") + s;
  joined = parallel::broadcast_string(joined + "]", 0);
  std::vector<std::vector<Runs>> out;
  for (const json& rank : json::parse(joined)) {
    out.emplace_back();
    for (const json& opt : rank) {
      out.back().emplace_back();
      for (const json& r : opt) out.back().back().push_back({r[0].get<size_t>(), r[1].get<size_t>(), r[2].get<size_t>()});
    }
  }
  return out;
}

// What a holder's files (`have`, in assignment order) send one rank whose optimizers want `want`, in the order both
// ends walk it: tensor, optimizer, file, overlap. visit(tensor, file, from, opt, to, n).
void for_transfer(const std::vector<Runs>& have, const std::vector<Runs>& want,
                  const std::function<void(int, size_t, size_t, size_t, size_t, size_t)>& visit) {
  for (int t = 0; t < 3; t++)
    for (size_t o = 0; o < want.size(); o++)
      for (size_t f = 0; f < have.size(); f++)
        for_overlaps(have[f], want[o], [&](size_t from, size_t to, size_t n) { visit(t, f, from, o, to, n); });
}

// Loads the assigned copies: each holder reads its files and sends every rank the slices its shards want.
TrainState load_local(const Config& cfg, const json& assign, ZeroOptimizers& opts) {
  const parallel::WorldInfo& w = parallel::world();
  const json& first = assign.front()["manifest"];
  const std::string what = "local checkpoint " + step_dir_name(first["step"].get<int64_t>());
  // Every file of the old world, and which rank holds it.
  std::vector<ShardFile> files;
  std::vector<int> holder_of;
  std::vector<std::string> path_of;
  for (const json& a : assign)
    for (const json& f : a["manifest"]["files"]) {
      files.push_back(parse_shard_entry(f, what));
      holder_of.push_back(a["holder"].get<int>());
      path_of.push_back(a["path"].get<std::string>() + "/" + files.back().name);
    }
  check_coverage(what, files, cfg.model);
  const std::vector<std::vector<Runs>> wants = gather_wants(cfg, opts);
  // By holder: its files' runs and (on the holder) their tensors.
  std::map<int, std::vector<Runs>> have;
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  std::vector<std::array<const float*, 3>> mine;
  for (size_t i = 0; i < files.size(); i++) {
    have[holder_of[i]].push_back(file_runs(cfg.model, files[i]));
    if (holder_of[i] != w.rank) continue;
    readers.push_back(std::make_unique<SafetensorsReader>(path_of[i]));
    std::array<const float*, 3> t{};
    for (int k = 0; k < 3; k++) {
      const SafeTensorInfo& info = readers.back()->info(kShardTensors[k]);
      YUAN_CHECK(info.dtype == "F32" && info.numel() == files[i].count, "%s: tensor '%s' is not F32[%zu]",
                 path_of[i].c_str(), kShardTensors[k], files[i].count);
      t[k] = reinterpret_cast<const float*>(readers.back()->raw(kShardTensors[k]));
    }
    mine.push_back(t);
  }
  MPI_Comm comm;
  {
    parallel::Waiting wait("comm_dup", "world");
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  }
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<float>> out(w.size), in;
  std::vector<int> from_holder;
  if (have.count(w.rank))
    for (int d = 0; d < w.size; d++) {
      for_transfer(have[w.rank], wants[d], [&](int t, size_t f, size_t from, size_t, size_t, size_t n) {
        out[d].insert(out[d].end(), mine[f][t] + from, mine[f][t] + from + n);
      });
      if (!out[d].empty()) post_floats(true, out[d].data(), out[d].size(), d, 0, comm, reqs);
    }
  for (const auto& [h, runs] : have) {
    size_t n = 0;
    for_transfer(runs, wants[w.rank], [&](int, size_t, size_t, size_t, size_t, size_t k) { n += k; });
    if (n == 0) continue;
    in.emplace_back(n);
    from_holder.push_back(h);
    post_floats(false, in.back().data(), n, h, 0, comm, reqs);
  }
  {
    // A holder lost now (its node gone since the listing) is named by the watchdog at dist.timeout_s.
    parallel::Waiting wait("local checkpoint redistribution", "world");
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }
  MPI_Comm_free(&comm);
  for (size_t i = 0; i < in.size(); i++) {
    size_t pos = 0;
    for_transfer(have[from_holder[i]], wants[w.rank], [&](int t, size_t, size_t, size_t o, size_t to, size_t n) {
      ZeroOptimizer& opt = *opts.all()[o];
      float* const dst[3] = {opt.master(), opt.exp_avg(), opt.exp_avg_sq()};
      std::memcpy(dst[t] + to, in[i].data() + pos, n * sizeof(float));
      pos += n;
    });
  }
  for (const auto& opt : opts.all()) {
    opt->set_adam_step(first["adam_step"].get<int64_t>());
    opt->load_backend_params();
  }
  TrainState st;
  st.step = first["step"].get<int64_t>();
  st.run = first["run"].get<int64_t>();
  st.next_sample = first["next_sample"].get<uint64_t>();
  return st;
}

}  // namespace

TrainState resume_best_tier(const Config& cfg, const ResumeChoice& fs_choice, ZeroOptimizers& opts, int64_t* run,
                            std::string* from) {
  const parallel::WorldInfo& w = parallel::world();
  std::string fs_dir = fs_choice.dir;  // the filesystem checkpoint to load, if the fast tier has nothing newer
  json final = {{"assign", json::array()}};
  // Node memory is listed whatever ckpt.resume says: its runs number this launch, and its checkpoints of this
  // run.dir refuse ckpt.resume=none as run.dir/ckpt's do.
  const std::string dir = resolve_local_dir(cfg, w.host);
  std::string listing = "[]";
  if (w.local_rank == 0) {
    try {
      listing = list_node(cfg, dir, w.rank).dump();
    } catch (const std::exception& e) {  // an unreadable directory holds nothing to resume from
      warn_all("local checkpoints in %s not looked at: %s", dir.c_str(), e.what());
    }
  }
  const std::vector<std::string> listings = parallel::gather_strings(listing);
  std::unique_ptr<Chooser> chooser;
  if (w.rank == 0) chooser = std::make_unique<Chooser>(listings, fs_choice.candidates);
  if (cfg.ckpt.resume == "none") {
    const std::string held = parallel::broadcast_string(chooser ? chooser->newest() : "", 0);
    if (!held.empty())
      throw Error(strf("run.dir %s: node memory holds its checkpoints (the newest is %s) and ckpt.resume=none would "
                       "start over in it, truncating its metrics.jsonl: continue with ckpt.resume=auto, start from a "
                       "checkpoint with ckpt.resume=DIR, or give another run.dir",
                       cfg.run.dir.c_str(), held.c_str()),
                  true);
  }
  if (cfg.ckpt.resume == "auto") {
    for (;;) {
      const json round = json::parse(parallel::broadcast_string(chooser ? chooser->next().dump() : "", 0));
      if (round["final"].get<bool>()) {
        final = round;
        fs_dir = round.value("fs", "");
        break;
      }
      if (round.contains("fs")) {
        const std::string why = checkpoint_problem(round["fs"].get<std::string>());
        if (chooser) chooser->fs_verdict(why);
        continue;
      }
      const std::vector<std::string> verdicts = parallel::gather_strings(verify_mine(round["assign"], w.rank));
      if (chooser) chooser->verdicts(verdicts);
    }
  }
  const int64_t local_max =
      static_cast<int64_t>(parallel::allreduce_max(chooser ? static_cast<double>(chooser->max_run()) : 0.0));
  *run = std::max(fs_choice.run, local_max + 1);
  const int64_t reached = w.rank == 0 ? last_logged_step(cfg.run.dir + "/metrics.jsonl") : -1;
  const json assign = final.value("assign", json::array());
  TrainState st;
  if (!assign.empty()) {
    st = load_local(cfg, assign, opts);
    int own = 0;
    for (const json& a : assign) own += a["own"].get<bool>();
    const int world = assign.front()["manifest"]["world"].get<int>();
    *from = strf("node memory (%d own %s, %d partner %s; written by %d %s%s)", own, own == 1 ? "copy" : "copies",
                 world - own, world - own == 1 ? "copy" : "copies", world, world == 1 ? "rank" : "ranks",
                 world != w.size ? strf(", optimizer state re-cut for %d", w.size).c_str() : "");
  } else if (!fs_dir.empty()) {
    st = load_checkpoint(fs_dir, cfg, opts);
    *from = "the filesystem checkpoint " + fs_dir;
  } else {
    *from = "";
    return st;
  }
  const auto step = [](int64_t s) { return static_cast<long long>(s); };
  say("resume: from %s, step %lld%s", from->c_str(), step(st.step),
      reached >= 0 ? strf("; steps lost: %lld (the previous run logged step %lld)",
                          step(std::max<int64_t>(0, reached - st.step)), step(reached)).c_str()
                   : "");
  // A step's record is written before any checkpoint of it is sealed (Trainer::run), so this is a log that lost
  // lines after it was written: said, since metrics.jsonl will never hold them.
  if (reached >= 0 && reached < st.step)
    warn("run.dir/metrics.jsonl ends at step %lld, before the checkpoint's step %lld: steps %lld-%lld have no record "
         "there",
         step(reached), step(st.step), step(reached + 1), step(st.step));
  return st;
}

}  // namespace yuan
