// The one-rank communicator: part of the core objects (no MPI), so single-process GPU tools can drive the
// ZeRO optimizer.
#include "comm/communicator.h"

#include <numeric>

#include "util/error.h"

namespace yuan {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  double sum(double x) override { return x; }

 protected:
  void do_all_reduce(void*, size_t, DType, ReduceOp) override {}
  void do_reduce_scatter(void*, const std::vector<size_t>& counts, DType) override {
    block_offsets(counts, 1, "reduce_scatter");
  }
  void do_all_gather(void*, const std::vector<size_t>& counts, DType) override {
    block_offsets(counts, 1, "all_gather");
  }
  void do_broadcast(void*, size_t, DType, int root) override {
    YUAN_CHECK(root == 0, "broadcast: root %d outside the 1 rank", root);
  }
  void do_send_recv(const void*, size_t send_bytes, int peer, void*, size_t recv_bytes, int peer2) override {
    YUAN_CHECK(send_bytes == 0 && recv_bytes == 0, "one-rank communicator: no rank %d to exchange with",
               send_bytes ? peer : peer2);
  }
};

}  // namespace

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce: return "all_reduce";
    case CommOp::ReduceScatter: return "reduce_scatter";
    case CommOp::AllGather: return "all_gather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::Send: return "send";
    case CommOp::kCount: break;
  }
  return "?";
}

size_t Communicator::elements(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}

std::vector<size_t> block_offsets(const std::vector<size_t>& counts, int ranks, const char* what) {
  YUAN_CHECK(counts.size() == static_cast<size_t>(ranks), "%s: %zu counts for %d ranks", what, counts.size(), ranks);
  std::vector<size_t> offs(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offs.begin() + 1);
  return offs;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace yuan
