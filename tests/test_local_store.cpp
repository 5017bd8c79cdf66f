// The fast checkpoint tier's storage (train/local_store.h): which rank keeps whose partner copy, the node-local
// storage it needs, where its directory is, the shard file layout its mapped copies share with run.dir/ckpt, the
// generations that take over the files of the one before the previous, and the listing and verification of what a
// node holds. The tier at work: tests/mpi/test_local_ckpt.sh (one host) and tests/cluster/test_local_ckpt_partner.sh
// (two nodes).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "layout/nodes.h"
#include "train/checkpoint.h"
#include "train/local_store.h"
#include "util/crc32c.h"
#include "util/fs.h"

namespace yuan {
namespace {

TEST(LocalStore, APartnerIsTheSameLocalRankOnTheNextNode) {
  const layout::NodeMap m = layout::NodeMap::blocks(3, 2);  // ranks 0-1, 2-3, 4-5
  std::vector<int> partners;
  for (int r = 0; r < 6; r++) partners.push_back(partner_rank(m, r));
  EXPECT_EQ(partners, (std::vector<int>{2, 3, 4, 5, 0, 1}));
  for (int r = 0; r < 6; r++) EXPECT_NE(m.node[partners[r]], m.node[r]) << "rank " << r;
}

TEST(LocalStore, UnevenNodesWrapTheLocalRankAndOneNodeHasNoPartner) {
  // Node 0 holds ranks 0-2, node 1 ranks 3-4: rank 2 has no local rank 2 on node 1 and goes to its local rank 0.
  const layout::NodeMap m = layout::NodeMap::from_leaders({0, 0, 0, 3, 3}, {"a", "a", "a", "b", "b"});
  std::vector<int> partners;
  for (int r = 0; r < 5; r++) partners.push_back(partner_rank(m, r));
  EXPECT_EQ(partners, (std::vector<int>{3, 4, 3, 0, 1}));
  const layout::NodeMap one = layout::NodeMap::blocks(1, 4);
  for (int r = 0; r < 4; r++) EXPECT_EQ(partner_rank(one, r), -1);
}

TEST(LocalStore, StorageIsTwoGenerationsOfOwnAndKeptShards) {
  const layout::NodeMap m = layout::NodeMap::from_leaders({0, 0, 0, 3, 3}, {"a", "a", "a", "b", "b"});
  const std::vector<size_t> own = {10, 20, 30, 40, 50};
  // Node 0: its own 10+20+30, and the copies of ranks 3 and 4 (40+50). Node 1: 40+50, and ranks 0, 1, 2's.
  EXPECT_EQ(local_storage_needed(m, own, 0), 2u * (60 + 90));
  EXPECT_EQ(local_storage_needed(m, own, 1), 2u * (90 + 60));
  EXPECT_EQ(local_storage_needed(layout::NodeMap::blocks(1, 2), {10, 20}, 0), 2u * 30);
}

TEST(LocalStore, EveryJobHasADirectoryOfItsOwnAndHostExpands) {
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

TEST(LocalStore, AShardFileIsItsPrefixThenTheTensorsAndTheCrcOfBoth) {
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


std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

ino_t inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// A fresh directory for one test.
std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "local_store_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// Fills a copy's files with values that depend on `seed`.
void fill(const LocalSlot& slot, float seed) {
  for (const auto& f : slot.files)
    for (size_t i = 0; i < 3 * f->count; i++) f->tensors[i] = seed + static_cast<float>(i);
}

TEST(LocalStore, AGenerationTakesOverTheFilesOfTheOneBeforeThePrevious) {
  const std::string dir = fresh_dir("generations");
  LocalStore store(dir, 3, {});
  const std::vector<std::pair<std::string, size_t>> shards = {{"optim_a.safetensors", 100}, {"optim_b.safetensors", 7}};
  const auto own = [&](int64_t step, const std::string& file) {
    return dir + "/" + step_dir_name(step) + "/rank_00003/" + file;
  };
  for (const int64_t step : {2, 4}) {
    store.prepare(step, false, false, shards);
    EXPECT_EQ(store.own().dir, dir + "/" + step_dir_name(step) + "/.tmp_rank_00003");
    fill(store.own(), static_cast<float>(step));
    store.seal_own(step, "manifest " + std::to_string(step));
  }
  EXPECT_EQ(read_all(own(2, "manifest.json")), "manifest 2");
  const ino_t first = inode(own(2, "optim_a.safetensors"));
  // Step 4 complete everywhere: step 6 is written into step 2's files, renamed, and step 2 is dropped.
  store.prepare(6, true, false, shards);
  EXPECT_EQ(inode(dir + "/step_0000006/.tmp_rank_00003/optim_a.safetensors"), first);
  store.drop_older(step_dir_name(4), step_dir_name(6));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_0000002"));
  EXPECT_TRUE(std::filesystem::exists(own(4, "optim_b.safetensors")));
  fill(store.own(), 6.0f);
  store.seal_own(6, "manifest 6");
  EXPECT_EQ(inode(own(6, "optim_a.safetensors")), first);
  const std::string b = read_all(own(6, "optim_b.safetensors"));
  const std::string prefix = shard_file_prefix(7);
  ASSERT_EQ(b.size(), prefix.size() + 3 * 7 * sizeof(float));
  EXPECT_EQ(b.substr(0, prefix.size()), prefix);
  float last = 0;
  std::memcpy(&last, b.data() + b.size() - sizeof(float), sizeof(float));
  EXPECT_EQ(last, 6.0f + 20);
  // Not complete: step 8 gets new files, as step 4's may be the last complete generation.
  store.prepare(8, false, false, shards);
  EXPECT_NE(inode(dir + "/step_0000008/.tmp_rank_00003/optim_a.safetensors"), inode(own(4, "optim_a.safetensors")));
  store.release();
  std::filesystem::remove_all(dir);
}

TEST(LocalStore, PartnerCopiesAreReceivedIntoTheFilesThatFitThem) {
  const std::string dir = fresh_dir("partner");
  LocalStore store(dir, 0, {5, 7});
  const nlohmann::json manifest = {{"files", {{{"name", "optim_r5.safetensors"}, {"count", 10}}}}};
  const std::string kept = dir + "/partner/step_0000002/rank_00005/optim_r5.safetensors";
  for (const int64_t step : {2, 4}) {
    store.prepare(step, false, false, {{"own.safetensors", 3}});
    for (size_t i = 0; i < 2; i++) fill(store.partner_files(i, step, manifest), static_cast<float>(step));
    for (size_t i = 0; i < 2; i++) store.seal_partner(i, step, "from sender " + std::to_string(i));
  }
  EXPECT_EQ(read_all(dir + "/partner/step_0000004/rank_00007/manifest.json"), "from sender 1");
  const ino_t first = inode(kept);
  store.prepare(6, true, true, {{"own.safetensors", 3}});
  EXPECT_EQ(inode(store.partner_files(0, 6, manifest).dir + "/optim_r5.safetensors"), first);
  // A copy cut otherwise (another world's shards) gets files of its own.
  const nlohmann::json other = {{"files", {{{"name", "optim_r5.safetensors"}, {"count", 11}}}}};
  const LocalSlot& s = store.partner_files(1, 6, other);
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.files[0]->count, 11u);
  store.release();
  std::filesystem::remove_all(dir);
}

TEST(LocalStore, ANodeListsItsJobsSealedCopiesAndVerifiesTheirFiles) {
  const std::string dir = fresh_dir("listing");
  Config cfg;
  cfg.run.dir = "/scratch/runs/listing";
  LocalStore store(dir, 1, {});
  store.prepare(4, false, false, {{"optim_r1.safetensors", 50}});
  fill(store.own(), 1.0f);
  const std::string copy = dir + "/step_0000004/rank_00001";
  const auto fields = [&](const std::string& run_dir, const std::string& crc) {
    return nlohmann::ordered_json{{"step", 4},         {"run", 2},
                                  {"world", 2},        {"rank", 1},
                                  {"run_dir", run_dir}, {"n_params", ParamLayout(cfg.model).total()},
                                  {"files", {{{"name", "optim_r1.safetensors"}, {"count", 50}, {"crc32c", crc}}}}};
  };
  store.seal_own(4, "unsealed");
  const std::string crc = crc32c_file(copy + "/optim_r1.safetensors");
  const std::string manifest = local_manifest(fields(absolute_run_dir(cfg), crc));
  EXPECT_EQ(nlohmann::ordered_json::parse(manifest).begin().key(), "format");  // written first
  write_file_atomic(copy + "/manifest.json", manifest);
  nlohmann::json listed = list_local_copies(cfg, dir, 6);
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["holder"], 6);
  EXPECT_EQ(listed[0]["own"], true);
  EXPECT_EQ(listed[0]["path"], copy);
  EXPECT_EQ(local_copy_problem(copy, listed[0]["manifest"]), "");
  // A flipped byte, then a file gone.
  {
    std::fstream f(copy + "/optim_r1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_NE(local_copy_problem(copy, listed[0]["manifest"]).find("does not match its checksum"), std::string::npos);
  std::filesystem::remove(copy + "/optim_r1.safetensors");
  EXPECT_NE(local_copy_problem(copy, listed[0]["manifest"]).find("is missing"), std::string::npos);
  // Another job's copy in a shared directory is left out; a manifest edited after its seal is named.
  write_file_atomic(copy + "/manifest.json", local_manifest(fields("/scratch/runs/other", crc)));
  EXPECT_TRUE(list_local_copies(cfg, dir, 0).empty());
  std::string edited = manifest;
  const std::string run = "\"run\": 2";
  edited.replace(edited.find(run), run.size(), "\"run\": 3");
  write_file_atomic(copy + "/manifest.json", edited);
  listed = list_local_copies(cfg, dir, 0);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_NE(listed[0]["problem"].get<std::string>().find("changed after it was written"), std::string::npos);
  store.release();
  std::filesystem::remove_all(dir);
}

TEST(LocalStore, ADirectoryThatCannotHoldTheCheckpointsIsNamed) {
  const std::string dir = fresh_dir("space");
  EXPECT_EQ(local_dir_problem(dir, 0, 1, "node a"), "");
  const std::string full = local_dir_problem(dir, 0, size_t{1} << 62, "node a");
  EXPECT_NE(full.find("ckpt.local_dir " + dir + " has "), std::string::npos) << full;
  EXPECT_NE(full.find("the local checkpoints of node a need"), std::string::npos) << full;
  write_file_atomic(dir + "/file", "x");
  EXPECT_NE(local_dir_problem(dir + "/file/sub", 0, 1, "node a").find("is not writable"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace yuan
