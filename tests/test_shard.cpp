// The shard format: files written by h5py are read token for token, files we write read back identically in
// h5py and h5dump, and every malformed file is a one-line error naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "data/shard.h"
#include "util/error.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

class Shard : public yuan::testing::TempDirTest {
 protected:

  // tools/write_h5_shard.py; token i is (i*7919+13) % vocab.
  std::string h5py_shard(const std::string& name, const std::string& args) {
    std::string p = path(name);
    std::string cmd = "/usr/bin/python3 tools/write_h5_shard.py " + p + " " + args;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return p;
  }
  static int32_t formula(uint64_t i, uint64_t vocab) { return static_cast<int32_t>((i * 7919 + 13) % vocab); }

  // What a command prints.
  static std::string run(const std::string& cmd) {
    std::string out;
    FILE* f = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(f), 0) << cmd;
    return out;
  }

  std::string write_ours(const std::string& name, int vocab, const std::vector<uint32_t>& tokens) {
    std::string p = path(name);
    ShardWriterUnderTest w(p, vocab);
    w.w.begin_document();
    w.w.append(tokens.data(), tokens.size() / 2);
    w.w.begin_document();
    w.w.append(tokens.data() + tokens.size() / 2, tokens.size() - tokens.size() / 2);
    w.w.close();
    return p;
  }
  struct ShardWriterUnderTest {
    ShardWriterUnderTest(const std::string& p, int vocab) : w(p, yuan::ShardMeta{vocab, 1, "test:sha256:ab"}, 0) {}
    yuan::ShardWriter w;
  };

  // The Error message of reading the whole of `p` with vocab checks, or "" when it reads cleanly.
  static std::string error_of(const std::string& p) {
    return yuan::testing::error_of([&] {
      yuan::ShardReader r(p, 64);
      std::vector<int32_t> buf(r.tokens());
      r.read(0, r.tokens(), buf.data());
    });
  }
};

// Plain little-endian data is read with pread(2) at the offsets HDF5 reports (direct); compressed and
// big-endian data goes through HDF5 hyperslabs. Both must give the same tokens, across chunk boundaries too.
TEST_F(Shard, ReadsH5pyShardsTokenForToken) {
  struct Case {
    const char* args;
    uint64_t n, vocab;
    bool direct;
  } cases[] = {{"--n 5000 --vocab 500 --dtype uint16 --chunks 64", 5000, 500, true},
               {"--n 3000 --vocab 70000 --dtype uint32", 3000, 70000, true},
               {"--n 999 --vocab 200 --dtype uint8 --chunks 100", 999, 200, true},
               {"--n 5000 --vocab 500 --dtype uint16 --chunks 64 --gzip", 5000, 500, false},
               {"--n 3000 --vocab 70000 --dtype '>u4' --chunks 256", 3000, 70000, false},
               {"--n 2000 --vocab 300 --dtype '>u2'", 2000, 300, false}};
  int k = 0;
  for (const Case& c : cases) {
    yuan::ShardReader r(h5py_shard("py" + std::to_string(k++) + ".h5", c.args), 129);
    EXPECT_EQ(r.direct(), c.direct) << c.args;
    EXPECT_EQ(r.tokens(), c.n);
    EXPECT_EQ(static_cast<uint64_t>(r.meta().vocab_size), c.vocab);
    EXPECT_EQ(r.meta().tokenizer, "test:sha256:0");
    std::vector<int32_t> buf(129);
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{63}, uint64_t{500}, c.n - 129}) {
      r.read(off, 129, buf.data());
      for (uint64_t i = 0; i < 129; i++) ASSERT_EQ(buf[i], formula(off + i, c.vocab)) << c.args << " at " << off + i;
    }
  }
}

TEST_F(Shard, OursReadBackByH5pyAndH5dump) {
  for (int vocab : {1000, 100000}) {  // uint16 and uint32 on disk
    std::vector<uint32_t> tokens(777);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<uint32_t>((i * 7919 + 13) % vocab);
    std::string p = write_ours("ours" + std::to_string(vocab) + ".h5", vocab, tokens);
    std::string expect;
    for (uint32_t t : tokens) expect += std::to_string(t) + " ";

    std::string py = run("/usr/bin/python3 -c \"import h5py; f = h5py.File('" + p +
                         "', 'r'); t = f['tokens']; a = f.attrs; print(t.dtype, a['format_version'], a['vocab_size'], "
                         "a['eot_id'], a['tokenizer'], list(f['doc_offsets'][:])); print(' '.join(map(str, t[:])))\"");
    EXPECT_EQ(py, std::string(vocab <= 65536 ? "uint16" : "uint32") + " 1 " + std::to_string(vocab) +
                      " 1 test:sha256:ab [0, 388]\n" + expect.substr(0, expect.size() - 1) + "\n");

    std::string dump = run("h5dump -d /tokens -y -w 0 " + p + " | sed -n '/DATA {/,/}/p' | tr -c '0-9\\n' ' '");
    std::string numbers;
    for (char c : dump) numbers += c == '\n' ? ' ' : c;
    std::string squeezed;
    for (size_t i = 0; i < numbers.size(); i++)
      if (numbers[i] != ' ' || (!squeezed.empty() && squeezed.back() != ' ')) squeezed += numbers[i];
    EXPECT_EQ(squeezed, expect);

    yuan::ShardReader r(p, 777);
    EXPECT_TRUE(r.direct());
    std::vector<int32_t> back(777);
    r.read(0, 777, back.data());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), tokens.begin()));
  }
}

// A shard cut short while a run reads it (replaced on a shared file system, disk full on copy) is an error
// naming the file and the offset, not zeros.
TEST_F(Shard, FileCutShortAfterOpenIsAnError) {
  std::string p = h5py_shard("cut_later.h5", "--n 100000 --chunks 4096");
  yuan::ShardReader r(p, 1025);
  ASSERT_TRUE(r.direct());
  std::vector<int32_t> buf(1025);
  r.read(90000, 1025, buf.data());
  fs::resize_file(p, fs::file_size(p) / 2);
  std::string msg = yuan::testing::error_of([&] { r.read(90000, 1025, buf.data()); });
  EXPECT_NE(msg.find(p + ": cannot read 1025 tokens at offset 90000: the file ends early"), std::string::npos) << msg;
}

TEST_F(Shard, InterruptedWriteLeavesNoShard) {
  std::string p = path("cut.h5");
  {
    yuan::ShardWriter w(p, yuan::ShardMeta{100, 0, "t"}, 0);
    uint32_t t[3] = {1, 2, 3};
    w.append(t, 3);
    EXPECT_TRUE(fs::exists(p + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(Shard, WriterRejectsOutOfVocabularyIds) {
  yuan::ShardWriter w(path("w.h5"), yuan::ShardMeta{100, 0, "t"}, 0);
  uint32_t t[2] = {5, 100};
  try {
    w.append(t, 2);
    FAIL() << "no error";
  } catch (const yuan::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 100 at offset 1"), std::string::npos) << e.what();
  }
}

TEST_F(Shard, BadFilesAreOneLineErrorsNamingTheFile) {
  std::string not_h5 = path("notes.h5");
  std::ofstream(not_h5) << "this is not HDF5\n";
  std::string good = h5py_shard("good.h5", "--n 4000");
  std::string truncated = path("truncated.h5");
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(good) / 2);

  struct Case {
    std::string file, expect;
  } cases[] = {
      {path("missing.h5"), "No such file"},
      {not_h5, "not a readable HDF5 file"},
      {truncated, "truncated"},
      {h5py_shard("notokens.h5", "--no-tokens"), "no /tokens"},
      {h5py_shard("float.h5", "--dtype float32"), "float32"},
      {h5py_shard("signed.h5", "--dtype int32"), "int32"},
      {h5py_shard("rank2.h5", "--rank 2"), "rank 2"},
      {h5py_shard("badid.h5", "--n 100 --vocab 50 --bad-id-at 37"), "token id 50 at offset 37 >= vocab_size 50"},
      {h5py_shard("badid_gz.h5", "--n 100 --vocab 50 --bad-id-at 37 --chunks 16 --gzip"),
       "token id 50 at offset 37 >= vocab_size 50"},
      {h5py_shard("eot.h5", "--vocab 50 --eot 50"), "eot_id 50"},
  };
  for (const Case& c : cases) {
    std::string msg = error_of(c.file);
    EXPECT_NE(msg.find(c.file), std::string::npos) << "error does not name " << c.file << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << msg;
  }
}

}  // namespace
