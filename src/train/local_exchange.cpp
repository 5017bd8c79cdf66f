#include "train/local_exchange.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "comm/channel.h"
#include "comm/world.h"
#include "layout/nodes.h"
#include "train/local_store.h"
#include "util/error.h"
#include "util/log.h"

namespace yuan {
using nlohmann::json;

namespace {

// Posts the sending (or receiving) of `store`'s floats of one copy, a message run per file (comm/channel.h).
void post_files(comm::Channel& channel, comm::Transfers& t, bool send, const LocalSlot& slot, int peer, int tag) {
  for (const auto& f : slot.files) {
    const size_t bytes = 3 * f->count * sizeof(float);
    if (send) channel.send(t, f->tensors, bytes, peer, tag);
    else channel.receive(t, f->tensors, bytes, peer, tag);
  }
}

}  // namespace

PartnerExchange::PartnerExchange(int partner, std::vector<int> senders, double timeout_s, std::string partner_label)
    : channel_(std::make_unique<comm::Channel>()),
      partner_(partner),
      senders_(std::move(senders)),
      timeout_s_(timeout_s),
      partner_label_(std::move(partner_label)) {
  if (const char* hook = std::getenv("YUANLM_PARTNER_SILENT")) silent_ = std::atoi(hook) == comm::world().rank;
}

PartnerExchange::~PartnerExchange() = default;

std::vector<size_t> PartnerExchange::all_gather(size_t mine) {
  const std::vector<unsigned long long> all = channel_->all_gather(mine, "local checkpoint sizes");
  return std::vector<size_t>(all.begin(), all.end());
}

void PartnerExchange::exchange(int64_t step, const std::string& manifest, LocalStore& store) {
  if (partner_ < 0 || !active_ || silent_) return;
  const double deadline = now_seconds() + timeout_s_;
  const int tag = static_cast<int>(step % 8192) * 3;  // a late message of another generation never matches
  std::vector<Head> heads(senders_.size());
  const LocalSlot& own = store.own();
  Head head = {manifest.size(), 0};
  for (const auto& f : own.files) head[1] += 3 * f->count;
  std::vector<std::string> texts(senders_.size());
  comm::Transfers head_in, sends;
  for (size_t i = 0; i < senders_.size(); i++) channel_->receive(head_in, heads[i].data(), sizeof(Head), senders_[i], tag);
  channel_->send(sends, head.data(), sizeof head, partner_, tag);
  channel_->send(sends, manifest.data(), manifest.size(), partner_, tag + 1);
  post_files(*channel_, sends, true, own, partner_, tag + 2);
  if (!head_in.wait_until(deadline) || !receive_copies(step, tag, heads, deadline, store, texts))
    return stop(step, strf("a rank it keeps copies of (ranks %s)", layout::ranks_text(senders_).c_str()));
  if (!sends.wait_until(deadline)) return stop(step, "its partner, " + partner_label_);
  for (size_t i = 0; i < senders_.size(); i++) store.seal_partner(i, step, texts[i]);
}

// The senders' manifests (into `texts`), then their floats, straight into `store`'s files; false when the deadline
// passed first.
bool PartnerExchange::receive_copies(int64_t step, int tag, const std::vector<Head>& heads, double deadline,
                                     LocalStore& store, std::vector<std::string>& texts) {
  comm::Transfers in;
  for (size_t i = 0; i < senders_.size(); i++) {
    texts[i].resize(heads[i][0]);
    channel_->receive(in, texts[i].data(), texts[i].size(), senders_[i], tag + 1);
  }
  if (!in.wait_until(deadline)) return false;
  // The floats come as the sender posted them, one run of messages per saved optimizer (a file of the manifest):
  // the receives must be cut the same way, or a message would land in a receive sized for another.
  for (size_t i = 0; i < senders_.size(); i++) {
    const json m = json::parse(texts[i]);
    size_t total = 0;
    for (const json& f : m["files"]) total += 3 * f["count"].get<size_t>();
    YUAN_CHECK(total == heads[i][1], "local checkpoint %s: rank %d's copy holds %llu values, its manifest lists %zu",
               step_dir_name(step).c_str(), senders_[i], heads[i][1], total);
    post_files(*channel_, in, false, store.partner_files(i, step, m), senders_[i], tag + 2);
  }
  return in.wait_until(deadline);
}

void PartnerExchange::stop(int64_t step, const std::string& who) {
  warn_all("local checkpoint %s: %s did not complete the partner exchange within %.0f s (dist.timeout_s); no more "
           "partner copies in this run, the filesystem checkpoint still holds",
           step_dir_name(step).c_str(), who.c_str(), timeout_s_);
  active_ = false;
}

std::vector<std::vector<float>> redistribute(std::vector<std::vector<float>>& out,
                                             const std::vector<std::pair<int, size_t>>& from) {
  comm::Channel channel;
  std::vector<std::vector<float>> in;
  for (const auto& [holder, n] : from) in.emplace_back(n);
  comm::Transfers t;
  for (size_t d = 0; d < out.size(); d++)
    channel.send(t, out[d].data(), out[d].size() * sizeof(float), static_cast<int>(d), 0);
  for (size_t i = 0; i < from.size(); i++) channel.receive(t, in[i].data(), in[i].size() * sizeof(float), from[i].first, 0);
  t.wait("local checkpoint redistribution");
  return in;
}

}  // namespace yuan
