// The training and validation loaders: rank slicing, resume, epochs, and one-line errors for bad corpora.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "util/error.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

constexpr int kSeq = 8, kVocab = 100000;

// A corpus whose token at global position p is p, so the first token of a window names it and each row must
// count up by one. Shards of 100, 57 and 81 tokens hold 12 + 7 + 10 = 29 windows.
class Loader : public yuan::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    uint32_t base = 0;
    int k = 0;
    for (uint32_t n : {100u, 57u, 81u}) {
      std::vector<uint32_t> t(n);
      for (uint32_t i = 0; i < n; i++) t[i] = base + i;
      write(yuan::strf("part_%d.h5", k++), t, yuan::ShardMeta{kVocab, 0, "test:sha256:0"});
      for (uint32_t w = 0; w < (n - 1) / kSeq; w++) windows_.insert(base + w * kSeq);
      base += n;
    }
  }

  std::string write(const std::string& name, const std::vector<uint32_t>& t, const yuan::ShardMeta& meta) {
    std::string p = dir_ + "/" + name;
    yuan::ShardWriter w(p, meta, t.size());
    w.append(t.data(), t.size());
    w.close();
    return p;
  }

  yuan::LoaderSpec spec(int rank, int world, int global_batch, int micro_batch) const {
    yuan::LoaderSpec s;
    s.glob = dir_ + "/part_*.h5";
    s.seq_len = kSeq;
    s.vocab_size = kVocab;
    s.seed = 42;
    s.rank = rank, s.world = world;
    s.global_batch = global_batch, s.micro_batch = micro_batch;
    s.prefetch = 2;
    return s;
  }

  // First tokens of the next `calls` micro-batches, checking every row is a run of consecutive positions.
  static std::vector<int32_t> take(yuan::TrainLoader& l, int calls, int micro_batch) {
    std::vector<int32_t> firsts;
    for (int c = 0; c < calls; c++) {
      const int32_t* b = l.next_micro_batch();
      for (int r = 0; r < micro_batch; r++) {
        const int32_t* row = b + r * (kSeq + 1);
        for (int i = 1; i <= kSeq; i++) EXPECT_EQ(row[i], row[0] + i);
        firsts.push_back(row[0]);
      }
    }
    return firsts;
  }

  std::string error_of(const yuan::LoaderSpec& s) {
    return yuan::testing::error_of([&] {
      yuan::TrainLoader l(s);
      l.next_micro_batch();
    });
  }

  std::set<int32_t> windows_;  // first tokens of all windows
};

TEST_F(Loader, TwoRanksSeeDisjointWindowsCoveringAnEpoch) {
  // global batch 4 over 2 ranks, micro-batch 1: each rank takes 2 micro-batches per step. 8 steps = 32 samples
  // cover the 29-window epoch; samples 29..31 begin epoch 1.
  yuan::TrainLoader r0(spec(0, 2, 4, 1)), r1(spec(1, 2, 4, 1)), solo(spec(0, 1, 4, 2));
  EXPECT_EQ(r0.windows(), 29u);
  std::vector<int32_t> stream;  // global sample order, rebuilt from the two slices
  for (int step = 0; step < 8; step++) {
    for (int32_t f : take(r0, 2, 1)) stream.push_back(f);
    for (int32_t f : take(r1, 2, 1)) stream.push_back(f);
  }
  std::set<int32_t> epoch(stream.begin(), stream.begin() + 29);
  EXPECT_EQ(epoch.size(), 29u) << "ranks overlapped";
  EXPECT_EQ(epoch, windows_);
  EXPECT_EQ(take(solo, 16, 2), stream) << "the global stream must not depend on the number of ranks";
  EXPECT_EQ(r0.next_sample(), 32u);
  EXPECT_EQ(r1.epoch(), 1u);
}

TEST_F(Loader, ResumingAtNextSampleYieldsTheSameBatches) {
  yuan::TrainLoader a(spec(1, 2, 8, 2));
  take(a, 5, 2);  // 2.5 steps: next_sample counts the step begun as taken
  EXPECT_EQ(a.next_sample(), 24u);
  take(a, 1, 2);
  uint64_t resume = a.next_sample();
  std::vector<int32_t> expect = take(a, 10, 2);
  yuan::TrainLoader b(spec(1, 2, 8, 2), resume);
  EXPECT_EQ(take(b, 10, 2), expect);
  EXPECT_EQ(b.next_sample(), a.next_sample());
}

TEST_F(Loader, EpochsRollOverWithADifferentPermutation) {
  yuan::TrainLoader l(spec(0, 1, 1, 1));
  std::vector<int32_t> e0 = take(l, 29, 1);
  EXPECT_EQ(l.epoch(), 1u);
  std::vector<int32_t> e1 = take(l, 29, 1);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()), windows_);
  EXPECT_EQ(std::set<int32_t>(e1.begin(), e1.end()), windows_);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, std::vector<int32_t>(windows_.begin(), windows_.end())) << "epoch 0 is not shuffled";
}

TEST_F(Loader, ValidationTakesEveryWorldthWindowInFileOrder) {
  yuan::LoaderSpec s = spec(1, 2, 4, 3);
  yuan::ValLoader v(s, 4);  // 4 batches x 3 rows x 2 ranks = 24 of the 29 windows, across all three shards
  std::vector<int32_t> order(windows_.begin(), windows_.end());
  for (int b = 0; b < v.batches(); b++) {
    const int32_t* p = v.batch(b);
    for (int r = 0; r < 3; r++) EXPECT_EQ(p[r * (kSeq + 1)], order[(b * 3 + r) * 2 + 1]);
  }
}

TEST_F(Loader, ValidationSetLargerThanTheCorpusIsRefused) {
  auto val_error = [&](int rank, int world, int batches, auto... keys) {
    return yuan::testing::error_of([&] { yuan::ValLoader(spec(rank, world, 4, 3), batches, keys...); });
  };
  // 5 batches x 3 rows x 2 ranks = 30 windows of the 29: one would be read twice and counted as another.
  const std::string msg = val_error(1, 2, 5);
  for (const std::string& part : {"data.val = " + dir_ + "/part_*.h5 holds 29 windows of 9 tokens",
                                 std::string("train.eval_batches 5 x 3 sequences x 2 readers = 30 windows"),
                                 std::string("give train.eval_batches <= 4")})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  // In the command's own words when it gives them; a request far past the corpus too.
  const std::string eval = val_error(0, 1, 1 << 30, "--data", "--batches");
  EXPECT_NE(eval.find("--data = "), std::string::npos) << eval;
  EXPECT_NE(eval.find("give --batches <= 9 "), std::string::npos) << eval;
  EXPECT_EQ(val_error(0, 1, 9), "");
  // One micro-batch per reader past the corpus: fewer batches cannot help, a smaller micro-batch or fewer readers can.
  auto micro_error = [&](int world, int micro_batch) {
    return yuan::testing::error_of([&] {
      yuan::ValLoader(spec(0, world, micro_batch, micro_batch), 1, "--data", "--batches", "--micro-batch");
    });
  };
  const std::string micro = micro_error(2, 1 << 20);
  EXPECT_NE(micro.find("fewer than one micro-batch reads (--micro-batch 1048576 x 2 readers = 2097152 windows): give "
                       "--micro-batch <= 14 or a larger validation set"),
            std::string::npos)
      << micro;
  EXPECT_NE(micro_error(30, 1).find("use at most 29 readers"), std::string::npos);
  EXPECT_EQ(micro_error(2, 14), "");
}

TEST_F(Loader, BadCorporaAreOneLineErrorsNamingTheFile) {
  yuan::LoaderSpec s = spec(0, 1, 2, 1);
  auto expect_error = [&](const yuan::LoaderSpec& sp, std::vector<std::string> parts) {
    std::string msg = error_of(sp);
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };

  s.glob = dir_ + "/none_*.h5";
  expect_error(s, {s.glob, "no shard files match"});
  s.glob = dir_ + "/missing.h5";
  expect_error(s, {s.glob});

  s = spec(0, 1, 2, 1);
  s.vocab_size = 512;
  expect_error(s, {dir_ + "/part_0.h5", "model.vocab_size = 512", "100000"});

  std::string short_shard = write("short_0.h5", {1, 2, 3}, {kVocab, 0, "test:sha256:0"});
  s = spec(0, 1, 2, 1);
  s.glob = dir_ + "/short_*.h5";
  expect_error(s, {short_shard, "shorter than one window"});

  std::vector<uint32_t> t(20, 7);
  s = spec(0, 1, 2, 1);  // part_*.h5 now also matches part_9.h5
  std::string other_vocab = write("part_9.h5", t, {kVocab + 1, 0, "test:sha256:0"});
  expect_error(s, {dir_ + "/part_0.h5", other_vocab, "vocab_size 100001 differs from 100000"});

  fs::remove(other_vocab);
  std::string other_tok = write("part_9.h5", t, {kVocab, 0, "test:sha256:1"});
  expect_error(s, {dir_ + "/part_0.h5", other_tok, "tokenizer"});
}

TEST_F(Loader, ReadErrorsInThePrefetchThreadReachTheCaller) {
  std::string bad = dir_ + "/bad.h5";
  std::string cmd = "/usr/bin/python3 tools/write_h5_shard.py " + bad + " --n 9 --vocab 50 --bad-id-at 5";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  yuan::LoaderSpec s = spec(0, 1, 1, 1);
  s.glob = bad;
  s.vocab_size = 50;
  std::string msg = error_of(s);
  EXPECT_NE(msg.find(bad + ": token id 50 at offset 5 >= vocab_size 50"), std::string::npos) << msg;
}

}  // namespace
