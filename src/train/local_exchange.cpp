#include "train/local_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"
#include "parallel/world.h"
#include "train/local_store.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {
using nlohmann::json;

namespace {

constexpr size_t kChunk = size_t{1} << 28;  // floats per MPI message: counts are ints

// A duplicate of the world communicator, freed with it.
struct OwnComm {
  MPI_Comm comm = MPI_COMM_NULL;
  OwnComm() {
    parallel::Waiting wait("comm_dup", "world");
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  }
  ~OwnComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  OwnComm(const OwnComm&) = delete;
  OwnComm& operator=(const OwnComm&) = delete;
};

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

}  // namespace

struct PartnerExchange::Comm : OwnComm {};  // the exchange's, for the whole run

PartnerExchange::PartnerExchange(int partner, std::vector<int> senders, double timeout_s, std::string partner_label)
    : comm_(std::make_unique<Comm>()),
      partner_(partner),
      senders_(std::move(senders)),
      timeout_s_(timeout_s),
      partner_label_(std::move(partner_label)) {
  if (const char* hook = std::getenv("YUANLM_PARTNER_SILENT")) silent_ = std::atoi(hook) == parallel::world().rank;
}

PartnerExchange::~PartnerExchange() = default;

std::vector<size_t> PartnerExchange::all_gather(size_t mine) {
  std::vector<unsigned long long> all(parallel::world().size);
  const unsigned long long m = mine;
  {
    parallel::Waiting wait("local checkpoint sizes", "world");
    MPI_CHECK(MPI_Allgather(&m, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm_->comm));
  }
  return std::vector<size_t>(all.begin(), all.end());
}

void PartnerExchange::exchange(int64_t step, const std::string& manifest, LocalStore& store) {
  if (partner_ < 0 || !active_ || silent_) return;
  const double deadline = now_seconds() + timeout_s_;
  const int tag = static_cast<int>(step % 8192) * 3;  // a late message of another generation never matches
  std::vector<Head> heads(senders_.size());
  std::vector<MPI_Request> head_reqs, sends;
  for (size_t i = 0; i < senders_.size(); i++) {
    head_reqs.emplace_back();
    MPI_CHECK(MPI_Irecv(heads[i].data(), 2, MPI_UNSIGNED_LONG_LONG, senders_[i], tag, comm_->comm, &head_reqs.back()));
  }
  const LocalSlot& own = store.own();
  Head head = {manifest.size(), 0};
  for (const auto& f : own.files) head[1] += 3 * f->count;
  sends.emplace_back();
  MPI_CHECK(MPI_Isend(head.data(), 2, MPI_UNSIGNED_LONG_LONG, partner_, tag, comm_->comm, &sends.back()));
  sends.emplace_back();
  MPI_CHECK(MPI_Isend(manifest.data(), static_cast<int>(manifest.size()), MPI_CHAR, partner_, tag + 1, comm_->comm,
                      &sends.back()));
  for (const auto& f : own.files) post_floats(true, f->tensors, 3 * f->count, partner_, tag + 2, comm_->comm, sends);
  std::vector<std::string> texts(senders_.size());
  if (!wait_until(head_reqs, deadline) || !receive_copies(step, tag, heads, deadline, store, texts)) {
    wait_until(sends, 0);  // cancels them
    return stop(step, strf("a rank it keeps copies of (ranks %s)", parallel::ranks_text(senders_).c_str()));
  }
  if (!wait_until(sends, deadline)) return stop(step, "its partner, " + partner_label_);
  for (size_t i = 0; i < senders_.size(); i++) store.seal_partner(i, step, texts[i]);
}

// The senders' manifests (into `texts`), then their floats, straight into `store`'s files; false when the deadline
// passed first.
bool PartnerExchange::receive_copies(int64_t step, int tag, const std::vector<Head>& heads, double deadline,
                                     LocalStore& store, std::vector<std::string>& texts) {
  std::vector<MPI_Request> reqs;
  for (size_t i = 0; i < senders_.size(); i++) {
    texts[i].resize(heads[i][0]);
    reqs.emplace_back();
    MPI_CHECK(MPI_Irecv(texts[i].data(), static_cast<int>(texts[i].size()), MPI_CHAR, senders_[i], tag + 1,
                        comm_->comm, &reqs.back()));
  }
  if (!wait_until(reqs, deadline)) return false;
  // The floats come as the sender posted them, one run of messages per saved optimizer (a file of the manifest):
  // the receives must be cut the same way, or a message would land in a receive sized for another.
  reqs.clear();
  for (size_t i = 0; i < senders_.size(); i++) {
    const json m = json::parse(texts[i]);
    size_t total = 0;
    for (const json& f : m["files"]) total += 3 * f["count"].get<size_t>();
    YUAN_CHECK(total == heads[i][1], "local checkpoint %s: rank %d's copy holds %llu values, its manifest lists %zu",
               step_dir_name(step).c_str(), senders_[i], heads[i][1], total);
    for (const auto& f : store.partner_files(i, step, m).files)
      post_floats(false, f->tensors, 3 * f->count, senders_[i], tag + 2, comm_->comm, reqs);
  }
  return wait_until(reqs, deadline);
}

void PartnerExchange::stop(int64_t step, const std::string& who) {
  warn_all("local checkpoint %s: %s did not complete the partner exchange within %.0f s (dist.timeout_s); no more "
           "partner copies in this run, the filesystem checkpoint still holds",
           step_dir_name(step).c_str(), who.c_str(), timeout_s_);
  active_ = false;
}

std::vector<std::vector<float>> redistribute(std::vector<std::vector<float>>& out,
                                             const std::vector<std::pair<int, size_t>>& from) {
  OwnComm comm;
  std::vector<MPI_Request> reqs;
  for (size_t d = 0; d < out.size(); d++)
    if (!out[d].empty()) post_floats(true, out[d].data(), out[d].size(), static_cast<int>(d), 0, comm.comm, reqs);
  std::vector<std::vector<float>> in;
  for (const auto& [holder, n] : from) {
    in.emplace_back(n);
    post_floats(false, in.back().data(), n, holder, 0, comm.comm, reqs);
  }
  {
    parallel::Waiting wait("local checkpoint redistribution", "world");
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }
  return in;
}

}  // namespace yuan
