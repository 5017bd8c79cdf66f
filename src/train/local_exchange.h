// The fast checkpoint tier's transport (the tier: train/local_ckpt.h), over transfers of its own (comm/channel.h)
// that never meet the training's messages (the job-wide agreements the tier takes part in, such as whether a
// generation is complete everywhere, are comm/world.h's). The partner exchange sends a rank's own copy to the rank
// that keeps it on the next node and receives the copies it keeps (LLNL SCR's partner scheme); the redistribution
// sends the ranks of a resumed launch the slices of the model their shards need.
//
// Test hook: YUANLM_PARTNER_SILENT=RANK makes that rank take no part in the partner exchanges, like a rank whose
// node stopped answering, so that the ranks it exchanges with time out (tests/cluster/test_local_ckpt_partner.sh).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace yuan {

namespace comm {
class Channel;
}
class LocalStore;

class PartnerExchange {
 public:
  // Collective: `partner` keeps this rank's copies (-1: none); `senders`, the ranks whose copies this rank keeps,
  // in the order of `store`'s (LocalStore); an exchange has `timeout_s` (dist.timeout_s) to complete; `partner_label`
  // names the partner in a warning.
  PartnerExchange(int partner, std::vector<int> senders, double timeout_s, std::string partner_label);
  ~PartnerExchange();
  PartnerExchange(const PartnerExchange&) = delete;
  PartnerExchange& operator=(const PartnerExchange&) = delete;

  // Collective: every rank's `mine`, by rank.
  std::vector<size_t> all_gather(size_t mine);
  // False once a partner did not answer in time: own copies only from then on.
  bool active() const { return active_; }
  // Sends the own copy of `step` that `store` holds (sealed, with its `manifest`) to the partner, and receives the
  // copies of the senders into `store`'s files and seals them, all within one timeout. A rank that does not answer
  // in time is warned about, and the exchanges stop for the rest of the run (what was posted to it may never
  // complete). Not the watchdog's deadline: a lost partner must cost only the partner copies, so the whole exchange
  // has one budget, and its transfers are cancelled when it runs out (comm/channel.h, wait_until).
  void exchange(int64_t step, const std::string& manifest, LocalStore& store);

 private:
  using Head = std::array<unsigned long long, 2>;  // a copy's manifest length and the floats that follow it
  bool receive_copies(int64_t step, int tag, const std::vector<Head>& heads, double deadline, LocalStore& store,
                      std::vector<std::string>& texts);
  void stop(int64_t step, const std::string& who);

  std::unique_ptr<comm::Channel> channel_;
  int partner_;
  std::vector<int> senders_;
  double timeout_s_;
  std::string partner_label_;
  bool silent_ = false;  // YUANLM_PARTNER_SILENT names this rank
  bool active_ = true;
};

// Collective, on a channel of its own: sends `out[d]` to every rank d whose is not empty, and receives `n`
// floats from each (rank, n) of `from`, returned in that order. A rank lost meanwhile is named by the watchdog at
// dist.timeout_s.
std::vector<std::vector<float>> redistribute(std::vector<std::vector<float>>& out,
                                             const std::vector<std::pair<int, size_t>>& from);

}  // namespace yuan
