// The fast checkpoint tier's arithmetic (train/local_ckpt.h): which rank keeps whose partner copy, the node-local
// storage it needs, where its directory is, and the shard file layout its mapped copies share with run.dir/ckpt.
// The tier at work: tests/mpi/test_local_ckpt.sh (one host) and tests/cluster/test_local_ckpt_partner.sh (two nodes).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/nodes.h"
#include "train/checkpoint.h"
#include "train/local_ckpt.h"
#include "util/crc32c.h"

namespace yuan {
namespace {

TEST(LocalTier, APartnerIsTheSameLocalRankOnTheNextNode) {
  const parallel::NodeMap m = parallel::NodeMap::blocks(3, 2);  // ranks 0-1, 2-3, 4-5
  std::vector<int> partners;
  for (int r = 0; r < 6; r++) partners.push_back(partner_rank(m, r));
  EXPECT_EQ(partners, (std::vector<int>{2, 3, 4, 5, 0, 1}));
  for (int r = 0; r < 6; r++) EXPECT_NE(m.node[partners[r]], m.node[r]) << "rank " << r;
}

TEST(LocalTier, UnevenNodesWrapTheLocalRankAndOneNodeHasNoPartner) {
  // Node 0 holds ranks 0-2, node 1 ranks 3-4: rank 2 has no local rank 2 on node 1 and goes to its local rank 0.
  const parallel::NodeMap m = parallel::NodeMap::from_leaders({0, 0, 0, 3, 3}, {"a", "a", "a", "b", "b"});
  std::vector<int> partners;
  for (int r = 0; r < 5; r++) partners.push_back(partner_rank(m, r));
  EXPECT_EQ(partners, (std::vector<int>{3, 4, 3, 0, 1}));
  const parallel::NodeMap one = parallel::NodeMap::blocks(1, 4);
  for (int r = 0; r < 4; r++) EXPECT_EQ(partner_rank(one, r), -1);
}

TEST(LocalTier, StorageIsTwoGenerationsOfOwnAndKeptShards) {
  const parallel::NodeMap m = parallel::NodeMap::from_leaders({0, 0, 0, 3, 3}, {"a", "a", "a", "b", "b"});
  const std::vector<size_t> own = {10, 20, 30, 40, 50};
  // Node 0: its own 10+20+30, and the copies of ranks 3 and 4 (40+50). Node 1: 40+50, and ranks 0, 1, 2's.
  EXPECT_EQ(local_storage_needed(m, own, 0), 2u * (60 + 90));
  EXPECT_EQ(local_storage_needed(m, own, 1), 2u * (90 + 60));
  EXPECT_EQ(local_storage_needed(parallel::NodeMap::blocks(1, 2), {10, 20}, 0), 2u * 30);
}

TEST(LocalTier, EveryJobHasADirectoryOfItsOwnAndHostExpands) {
  Config a, b;
  a.run.dir = "/scratch/runs/x";
  b.run.dir = "/scratch/runs/x/";  // the same directory
  const std::string dir = resolve_local_dir(a, "n1");
  EXPECT_EQ(dir.rfind("/dev/shm/yuanlm-", 0), 0u) << dir;
  EXPECT_EQ(dir.size(), std::string("/dev/shm/yuanlm-").size() + 16) << dir;
  EXPECT_EQ(resolve_local_dir(b, "n2"), dir);
  b.run.dir = "/scratch/runs/y";
  EXPECT_NE(resolve_local_dir(b, "n1"), dir);
  // A ckpt.local_dir given to two jobs (a site default, a copied deck) holds a directory for each.
  a.ckpt.local_dir = b.ckpt.local_dir = "/local/%h/ckpt-%h/";
  const std::string job = dir.substr(dir.rfind('/'));
  EXPECT_EQ(resolve_local_dir(a, "node7"), "/local/node7/ckpt-node7" + job);
  EXPECT_NE(resolve_local_dir(b, "node7"), resolve_local_dir(a, "node7"));
}

TEST(LocalTier, AShardFileIsItsPrefixThenTheTensorsAndTheCrcOfBoth) {
  // The tier writes its own copies through a mapping: shard_file_prefix, then the three tensors one after another,
  // the CRC-32C chained over those pieces. They must be the bytes of the file write_shard_file writes, which the
  // readers of both tiers read, and that checksum the file's.
  const size_t count = 1001;  // odd: the tensors after the first do not start 8-byte aligned
  std::vector<float> t(3 * count);
  for (size_t i = 0; i < t.size(); i++) t[i] = 0.25f * static_cast<float>(i) - 7.0f;
  const float* const tensors[3] = {t.data(), t.data() + count, t.data() + 2 * count};
  const std::string path = ::testing::TempDir() + "local_tier_shard.safetensors";
  write_shard_file(path, count, tensors);
  const std::string prefix = shard_file_prefix(count);
  EXPECT_EQ(prefix.size() % 8, 0u);
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(file.size(), prefix.size() + t.size() * sizeof(float));
  EXPECT_EQ(file.substr(0, prefix.size()), prefix);
  std::vector<char> mapped(file.size());
  uint32_t crc = crc32c_copy(0, mapped.data(), prefix.data(), prefix.size());
  for (int k = 0; k < 3; k++)
    crc = crc32c_copy(crc, mapped.data() + prefix.size() + k * count * sizeof(float), tensors[k],
                      count * sizeof(float));
  EXPECT_EQ(std::string(mapped.begin(), mapped.end()), file);
  EXPECT_EQ(crc32c_file(path), crc32c_hex(crc));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace yuan
