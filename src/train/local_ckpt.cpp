#include "train/local_ckpt.h"

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "comm/world.h"
#include "train/local_choice.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/log.h"
#include "util/memory.h"
#include "util/safetensors.h"

namespace yuan {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::vector<int> all_partners(const layout::NodeMap& nodes) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(nodes.node.size()); r++) out.push_back(partner_rank(nodes, r));
  return out;
}

// The ranks whose partner copies `rank` keeps.
std::vector<int> senders_of(const layout::NodeMap& nodes, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(nodes.node.size()); r++)
    if (partner_rank(nodes, r) == rank) out.push_back(r);
  return out;
}

std::string rank_label(const layout::NodeMap& nodes, int rank) {
  return rank < 0 ? "" : strf("rank %d on %s", rank, nodes.label(nodes.node[rank]).c_str());
}

}  // namespace

LocalTier::LocalTier(const Config& cfg, const ZeroOptimizers& opts)
    : run_dir_(absolute_run_dir(cfg)),
      n_params_(ParamLayout(cfg.model).total()),
      partners_(all_partners(comm::node_map())),
      store_(resolve_local_dir(cfg, comm::world().host), comm::world().rank,
             senders_of(comm::node_map(), comm::world().rank)),
      exchange_(partners_[comm::world().rank], senders_of(comm::node_map(), comm::world().rank),
                cfg.dist.timeout_s, rank_label(comm::node_map(), partners_[comm::world().rank])) {
  const comm::WorldInfo& w = comm::world();
  const layout::NodeMap& nodes = comm::node_map();
  if (const char* hook = std::getenv("YUANLM_KILL_AFTER_SEAL"); hook && w.rank == 0)
    kill_after_seal_ = std::atoll(hook);
  // What every rank keeps, so that each checks its node's directory for its ranks and their partners' copies.
  const size_t mine = own_copy_bytes(opts);
  const size_t need = local_storage_needed(nodes, exchange_.all_gather(mine), w.node);
  const std::string problem =
      comm::first_problem(local_dir_problem(store_.dir(), w.rank, need, nodes.label(w.node)));
  if (!problem.empty()) throw Error(problem, true);

  for (const ZeroOptimizer* opt : saved_optimizers(opts)) files_.push_back(shard_file_name(w.rank, *opt));
  const int partner = partners_[w.rank];
  say("local checkpoints every %d steps in %s on every node (rank 0: %s; %s)", cfg.ckpt.local_every,
      store_.dir().c_str(), format_bytes(static_cast<double>(mine)).c_str(),
      partner >= 0 ? strf("its partner copy on %s", rank_label(nodes, partner).c_str()).c_str() : "no partner copy");
  if (nodes.nodes() < 2)
    warn("ckpt.local_every: the job runs on one node, so there are no partner copies: a rank's local checkpoint is "
         "only in its own node's %s", store_.dir().c_str());
  if (!w.thread_multiple)
    warn("ckpt.local_every: MPI has no MPI_THREAD_MULTIPLE, so local checkpoints are written in the training "
         "thread, not beside it");
}

LocalTier::~LocalTier() {
  if (writer_.joinable()) writer_.join();
}

void LocalTier::save(const TrainState& st, const ZeroOptimizers& opts) {
  if (writer_.joinable()) writer_.join();  // the only wait the step has: the previous write still going
  const std::string name = step_dir_name(st.step);
  // Once the previous generation is complete on every rank, the older ones (and copies of abandoned timelines) go,
  // and this one takes over the files of the one before the previous: they are renamed to this one's .tmp_
  // directories before any rank of the node drops the older generations.
  const bool complete = comm::allreduce_max(ok_ ? 0.0 : 1.0) == 0.0;
  const bool drop = !previous_.empty() && complete;
  const std::vector<ZeroOptimizer*> saved = saved_optimizers(opts);
  std::vector<std::pair<std::string, size_t>> shards;
  for (size_t i = 0; i < saved.size(); i++) shards.emplace_back(files_[i], saved[i]->shard_size());
  std::string problem;
  try {
    store_.prepare(st.step, drop, drop && exchange_.active(), shards);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (drop) comm::barrier();
  if (drop && comm::world().local_rank == 0) store_.drop_older(previous_, name);
  previous_ = name;
  ok_ = false;
  if (!problem.empty()) {
    warn_all("local checkpoint %s not written: %s", name.c_str(), problem.c_str());
    return;
  }
  // The copy runs here, in the step (the update cannot run meanwhile); the writer thread only seals it.
  pending_.emplace(st.step, local_manifest(manifest_fields(st, opts, store_.copy_in(saved))));
}

ordered_json LocalTier::manifest_fields(const TrainState& st, const ZeroOptimizers& opts,
                                        const std::vector<uint32_t>& crcs) const {
  const std::vector<ZeroOptimizer*> saved = saved_optimizers(opts);
  ordered_json files = ordered_json::array();
  for (size_t i = 0; i < saved.size(); i++) {
    files.push_back(shard_entry(*saved[i], files_[i]));
    files.back()["crc32c"] = crc32c_hex(crcs[i]);
  }
  const comm::WorldInfo& w = comm::world();
  return {{"step", st.step},
          {"run", st.run},
          {"next_sample", st.next_sample},
          {"adam_step", opts.all().front()->adam_step()},
          {"world", w.size},
          {"rank", w.rank},
          {"host", w.host},
          {"run_dir", run_dir_},
          {"n_params", n_params_},
          {"hosts", comm::world_hosts()},
          {"partners", partners_},
          {"files", files}};
}

void LocalTier::seal() {
  if (!pending_) return;
  auto [step, manifest] = std::move(*pending_);
  pending_.reset();
  if (comm::world().thread_multiple)
    writer_ = std::thread([this, step = step, manifest = std::move(manifest)] { write(step, manifest); });
  else
    write(step, manifest);
}

void LocalTier::write(int64_t step, const std::string& manifest) {
  try {
    store_.seal_own(step, manifest);
    if (step == kill_after_seal_) std::raise(SIGKILL);
    // Once partner copies have stopped for this run (a partner that did not answer), the own copy is all a
    // generation gets: complete when written, so that older generations still go and node memory stays bounded.
    exchange_.exchange(step, manifest, store_);
    ok_ = true;
  } catch (const std::exception& e) {  // the filesystem tier still holds: training goes on
    warn_all("local checkpoint %s not written: %s", step_dir_name(step).c_str(), e.what());
  }
}

void LocalTier::finish() {
  if (writer_.joinable()) writer_.join();
  pending_.reset();
  store_.release();
}

void remove_local_checkpoints(const Config& cfg) {
  comm::barrier();  // no rank of the node is still writing
  const comm::WorldInfo& w = comm::world();
  if (w.local_rank != 0) return;
  std::error_code ec;
  fs::remove_all(resolve_local_dir(cfg, w.host), ec);  // the job's own: ckpt.local_dir may hold other jobs'
}

namespace {

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
  for (const std::string& s : comm::gather_strings(mine.dump())) joined += (joined.empty() ? "[" : ",") + s;
  joined = comm::broadcast_string(joined + "]", 0);
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

// The files of an assignment (Chooser::next), by old rank then file, and which rank holds each.
struct AssignedFiles {
  std::vector<ShardFile> files;
  std::vector<int> holder;
  std::vector<std::string> path;
  std::map<int, std::vector<Runs>> runs;  // by holder: its files' runs, in assignment order
};

AssignedFiles assigned_files(const Config& cfg, const json& assign, const std::string& what) {
  AssignedFiles a;
  for (const json& copy : assign)
    for (const json& f : copy["manifest"]["files"]) {
      a.files.push_back(parse_shard_entry(f, what));
      a.holder.push_back(copy["holder"].get<int>());
      a.path.push_back(copy["path"].get<std::string>() + "/" + a.files.back().name);
    }
  check_coverage(what, a.files, cfg.model);
  for (size_t i = 0; i < a.files.size(); i++) a.runs[a.holder[i]].push_back(file_runs(cfg.model, a.files[i]));
  return a;
}

// The tensors of the files rank `me` holds, in assignment order, read through `readers`.
std::vector<std::array<const float*, 3>> read_held(const AssignedFiles& a, int me,
                                                   std::vector<std::unique_ptr<SafetensorsReader>>& readers) {
  std::vector<std::array<const float*, 3>> out;
  for (size_t i = 0; i < a.files.size(); i++) {
    if (a.holder[i] != me) continue;
    readers.push_back(std::make_unique<SafetensorsReader>(a.path[i]));
    std::array<const float*, 3> t{};
    for (int k = 0; k < 3; k++) {
      const SafeTensorInfo& info = readers.back()->info(kShardTensors[k]);
      YUAN_CHECK(info.dtype == "F32" && info.numel() == a.files[i].count, "%s: tensor '%s' is not F32[%zu]",
                 a.path[i].c_str(), kShardTensors[k], a.files[i].count);
      t[k] = reinterpret_cast<const float*>(readers.back()->raw(kShardTensors[k]));
    }
    out.push_back(t);
  }
  return out;
}

// Loads the assigned copies: each holder reads its files and sends every rank the slices its shards want.
TrainState load_local(const Config& cfg, const json& assign, ZeroOptimizers& opts) {
  const comm::WorldInfo& w = comm::world();
  const json& first = assign.front()["manifest"];
  AssignedFiles a = assigned_files(cfg, assign, "local checkpoint " + step_dir_name(first["step"].get<int64_t>()));
  const std::vector<std::vector<Runs>> wants = gather_wants(cfg, opts);
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  const std::vector<std::array<const float*, 3>> mine = read_held(a, w.rank, readers);
  std::vector<std::vector<float>> out(w.size);
  if (a.runs.count(w.rank))
    for (int d = 0; d < w.size; d++)
      for_transfer(a.runs[w.rank], wants[d], [&](int t, size_t f, size_t from, size_t, size_t, size_t n) {
        out[d].insert(out[d].end(), mine[f][t] + from, mine[f][t] + from + n);
      });
  std::vector<std::pair<int, size_t>> from;
  for (const auto& [h, runs] : a.runs) {
    size_t n = 0;
    for_transfer(runs, wants[w.rank], [&](int, size_t, size_t, size_t, size_t, size_t k) { n += k; });
    if (n > 0) from.emplace_back(h, n);
  }
  const std::vector<std::vector<float>> in = redistribute(out, from);
  for (size_t i = 0; i < in.size(); i++) {
    size_t pos = 0;
    for_transfer(a.runs[from[i].first], wants[w.rank], [&](int t, size_t, size_t, size_t o, size_t to, size_t n) {
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

// Collective: every node's first rank lists its directory; rank 0 gets the Chooser of all they hold (others null).
std::unique_ptr<Chooser> list_nodes(const Config& cfg, const ResumeChoice& fs_choice) {
  const comm::WorldInfo& w = comm::world();
  const std::string dir = resolve_local_dir(cfg, w.host);
  std::string listing = "[]";
  if (w.local_rank == 0) {
    try {
      listing = list_local_copies(cfg, dir, w.rank).dump();
    } catch (const std::exception& e) {  // an unreadable directory holds nothing to resume from
      warn_all("local checkpoints in %s not looked at: %s", dir.c_str(), e.what());
    }
  }
  const std::vector<std::string> listings = comm::gather_strings(listing);
  if (w.rank != 0) return nullptr;
  return std::make_unique<Chooser>(listings, fs_choice.candidates, comm::world_hosts());
}

// Collective: the Chooser's rounds (on rank 0), each verified by the ranks it names, up to the final one.
json choose(Chooser* chooser) {
  for (;;) {
    const json round = json::parse(comm::broadcast_string(chooser ? chooser->next().dump() : "", 0));
    if (round["final"].get<bool>()) return round;
    if (round.contains("fs")) {
      const std::string why = checkpoint_problem(round["fs"].get<std::string>());
      if (chooser) chooser->fs_verdict(why);
      continue;
    }
    const std::vector<std::string> verdicts =
        comm::gather_strings(verify_assigned(round["assign"], comm::world().rank));
    if (chooser) chooser->verdicts(verdicts);
  }
}

// What the resume says it loaded from node memory.
std::string node_memory_text(const json& assign, int world_now) {
  int own = 0;
  for (const json& a : assign) own += a["own"].get<bool>();
  const int world = assign.front()["manifest"]["world"].get<int>();
  return strf("node memory (%d own %s, %d partner %s; written by %d %s%s)", own, own == 1 ? "copy" : "copies",
              world - own, world - own == 1 ? "copy" : "copies", world, world == 1 ? "rank" : "ranks",
              world != world_now ? strf(", optimizer state re-cut for %d", world_now).c_str() : "");
}

void say_resumed(const std::string& from, int64_t step, int64_t reached) {
  const auto ll = [](int64_t s) { return static_cast<long long>(s); };
  say("resume: from %s, step %lld%s", from.c_str(), ll(step),
      reached >= 0 ? strf("; steps lost: %lld (the previous run logged step %lld)",
                          ll(std::max<int64_t>(0, reached - step)), ll(reached)).c_str()
                   : "");
  // A step's record is written before any checkpoint of it is sealed (Trainer::run), so this is a log that lost
  // lines after it was written: said, since metrics.jsonl will never hold them.
  if (reached >= 0 && reached < step)
    warn("run.dir/metrics.jsonl ends at step %lld, before the checkpoint's step %lld: steps %lld-%lld have no record "
         "there",
         ll(reached), ll(step), ll(reached + 1), ll(step));
}

}  // namespace

TrainState resume_best_tier(const Config& cfg, const ResumeChoice& fs_choice, ZeroOptimizers& opts, int64_t* run,
                            std::string* from) {
  const comm::WorldInfo& w = comm::world();
  std::string fs_dir = fs_choice.dir;  // the filesystem checkpoint to load, if the fast tier has nothing newer
  json assign = json::array();
  // Node memory is listed whatever ckpt.resume says: its runs number this launch, and its checkpoints of this
  // run.dir refuse ckpt.resume=none as run.dir/ckpt's do.
  const std::unique_ptr<Chooser> chooser = list_nodes(cfg, fs_choice);
  if (cfg.ckpt.resume == "none") {
    const std::string held = comm::broadcast_string(chooser ? chooser->newest() : "", 0);
    if (!held.empty())
      throw Error(strf("run.dir %s: node memory holds its checkpoints (the newest is %s) and ckpt.resume=none would "
                       "start over in it, truncating its metrics.jsonl: continue with ckpt.resume=auto, start from a "
                       "checkpoint with ckpt.resume=DIR, or give another run.dir",
                       cfg.run.dir.c_str(), held.c_str()),
                  true);
  }
  if (cfg.ckpt.resume == "auto") {
    const json final = choose(chooser.get());
    fs_dir = final.value("fs", "");
    assign = final.value("assign", json::array());
  }
  const int64_t local_max =
      static_cast<int64_t>(comm::allreduce_max(chooser ? static_cast<double>(chooser->max_run()) : 0.0));
  *run = std::max(fs_choice.run, local_max + 1);
  const int64_t reached = w.rank == 0 ? last_logged_step(cfg.run.dir + "/metrics.jsonl") : -1;
  TrainState st;
  if (!assign.empty()) {
    st = load_local(cfg, assign, opts);
    *from = node_memory_text(assign, w.size);
  } else if (!fs_dir.empty()) {
    st = load_checkpoint(fs_dir, cfg, opts);
    *from = "the filesystem checkpoint " + fs_dir;
  } else {
    *from = "";
    return st;
  }
  say_resumed(*from, st.step, reached);
  return st;
}

}  // namespace yuan
