// The fast checkpoint tier's transport (train/local_exchange.h) under mpirun (1 to 4 ranks): in a ring of partners,
// every rank's sealed copy arrives whole in the files its partner keeps for it, with its manifest; the redistribution
// of a resume delivers every rank's slices from every holder. A partner that does not answer:
// tests/cluster/test_local_ckpt_partner.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/world.h"
#include "train/checkpoint.h"
#include "train/local_exchange.h"
#include "train/local_store.h"

namespace yuan {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(MpiLocalExchange, EveryCopyArrivesWholeInItsPartnersFiles) {
  const int n = comm::world().size, me = comm::world().rank;
  if (n < 2) GTEST_SKIP() << "a partner needs two ranks";
  const int partner = (me + 1) % n, sender = (me + n - 1) % n;
  const std::string dir = ::testing::TempDir() + "local_exchange_" + std::to_string(me);
  std::filesystem::remove_all(dir);
  const auto count = [](int rank) { return size_t{1000} + 37 * rank; };  // every rank's shard of another size
  LocalStore store(dir, me, {sender});
  PartnerExchange exchange(partner, {sender}, 60, "rank " + std::to_string(partner));
  for (const int64_t step : {2, 4}) {
    store.prepare(step, false, false, {{"optim_" + std::to_string(me) + ".safetensors", count(me)}});
    for (const auto& f : store.own().files)
      for (size_t i = 0; i < 3 * f->count; i++) f->tensors[i] = static_cast<float>(step * 100000 + me * 10000 + i);
    const nlohmann::json files = {{{"name", "optim_" + std::to_string(me) + ".safetensors"}, {"count", count(me)}}};
    const std::string manifest = nlohmann::json{{"step", step}, {"rank", me}, {"files", files}}.dump();
    store.seal_own(step, manifest);
    exchange.exchange(step, manifest, store);
    EXPECT_TRUE(exchange.active());
  }
  const std::string kept = dir + "/partner/step_0000004/" + rank_dir_name(sender);
  EXPECT_EQ(nlohmann::json::parse(read_all(kept + "/manifest.json"))["rank"], sender);
  const std::string file = read_all(kept + "/optim_" + std::to_string(sender) + ".safetensors");
  const std::string prefix = shard_file_prefix(count(sender));
  ASSERT_EQ(file.size(), prefix.size() + 3 * count(sender) * sizeof(float));
  std::vector<float> values(3 * count(sender));
  std::memcpy(values.data(), file.data() + prefix.size(), values.size() * sizeof(float));
  for (size_t i = 0; i < values.size(); i++)
    ASSERT_EQ(values[i], static_cast<float>(4 * 100000 + sender * 10000 + i)) << i;
  store.release();
  comm::barrier();  // every rank done with its files
  std::filesystem::remove_all(dir);
}

TEST(MpiLocalExchange, TheRedistributionDeliversEveryHoldersSlices) {
  const int n = comm::world().size, me = comm::world().rank;
  // Rank h sends rank d h+d+1 values h*100+d; rank 0 holds nothing for anyone.
  std::vector<std::vector<float>> out(n);
  if (me > 0)
    for (int d = 0; d < n; d++) out[d].assign(me + d + 1, static_cast<float>(me * 100 + d));
  std::vector<std::pair<int, size_t>> from;
  for (int h = 1; h < n; h++) from.emplace_back(h, h + me + 1);
  const std::vector<std::vector<float>> in = redistribute(out, from);
  ASSERT_EQ(in.size(), from.size());
  for (size_t i = 0; i < in.size(); i++)
    EXPECT_EQ(in[i], std::vector<float>(from[i].second, static_cast<float>(from[i].first * 100 + me)));
}

}  // namespace
}  // namespace yuan
