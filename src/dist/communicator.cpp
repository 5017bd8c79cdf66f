// The one-rank communicator: part of the core objects (no MPI), so single-process GPU tools can drive the
// ZeRO optimizer.
#include "dist/communicator.h"

#include "util/error.h"

namespace yuan {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(void*, size_t, DType, ReduceOp) override {}
  void reduce_scatter(void*, const std::vector<size_t>& counts, DType) override { check(counts); }
  void all_gather(void*, const std::vector<size_t>& counts, DType) override { check(counts); }
  void broadcast(void*, size_t, DType, int root) override {
    YUAN_CHECK(root == 0, "broadcast: root %d outside the 1 rank", root);
  }
  void barrier() override {}
  double sum(double x) override { return x; }

 private:
  static void check(const std::vector<size_t>& counts) {
    YUAN_CHECK(counts.size() == 1, "local communicator: %zu counts for 1 rank", counts.size());
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace yuan
