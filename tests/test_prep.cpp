// `yuanlm prep`: input formats, tokenizers, determinism across thread counts, and that its shards are what the
// loader, h5py and h5dump read.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/loader.h"
#include "prep/documents.h"
#include "prep/prep.h"
#include "prep/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/rng.h"
#include "util/sha256.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

class Prep : public yuan::testing::TempDirTest {
 protected:
  static std::vector<std::string> docs_of(const std::string& path, yuan::InputFormat f, bool blank = false) {
    yuan::Documents d(yuan::expand_inputs({path}, f), blank);
    std::vector<std::string> out;
    for (std::string s; d.next(s);) out.push_back(s);
    return out;
  }

  // About 12 KB in three formats: fortune (with colour codes), JSON Lines and plain text.
  std::vector<std::string> corpus() {
    static const char* words[] = {"the", "model", "reads", "tokens", "from", "shards", "and", "every", "rank",
                                  "takes", "its", "slice", "of", "a", "window", "学习", "数据", "模型", "42", "GPU"};
    yuan::Rng rng(7, 0);
    auto sentence = [&] {
      std::string s;
      for (int w = 3 + rng.next_u64() % 8; w > 0; w--) s += std::string(words[rng.next_u64() % 20]) + (w > 1 ? " " : ".");
      return s;
    };
    std::string fortune, jsonl, text;
    for (int d = 0; d < 40; d++) fortune += "\x1b[32m" + sentence() + "\x1b[m\n" + sentence() + "\n%\n";
    for (int d = 0; d < 40; d++) jsonl += "{\"id\": " + std::to_string(d) + ", \"text\": \"" + sentence() + "\\n" + sentence() + "\"}\n";
    for (int d = 0; d < 40; d++) text += sentence() + " " + sentence() + "\n";
    return {file("poems", fortune), file("web.jsonl", jsonl), file("books.txt", text)};
  }

  void prep(std::vector<std::string> args) { EXPECT_EQ(yuan::prep_main(args), 0); }

  static nlohmann::json manifest(const std::string& out) {
    return nlohmann::json::parse(std::ifstream(out + "/manifest.json"));
  }

  static std::string error_of(const std::vector<std::string>& args) {
    return yuan::testing::error_of([&] { yuan::prep_main(args); });
  }

  // Every file under `dir` (recursively) with its sha256: two snapshots are equal when nothing was added,
  // removed or changed.
  static std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = yuan::sha256_file(e.path().string());
    return files;
  }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // The name this host's prep with process id `pid` gives its sibling `kind` of --out `name`.
  static std::string sibling(const std::string& name, const char* kind, long pid) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return "." + name + "." + kind + "-" + std::to_string(pid) + "@" + host;
  }

  // A line of `n` distinct CJK characters, each once.
  static std::string distinct_cjk(uint32_t n) {
    std::string text;
    for (uint32_t c = 0x4E00; c < 0x4E00 + n; c++)
      text += {static_cast<char>(0xE0 | c >> 12), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
               static_cast<char>(0x80 | (c & 0x3F))};
    return text + "\n";
  }

  // A process id that no process has: that of a child that has exited and been reaped.
  static long dead_pid() {
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, nullptr, 0);
    return pid;
  }
};

TEST_F(Prep, ReadsFortuneJsonlAndTextDocuments) {
  std::string f = file("fortunes", "\x1b[32m《静夜思》\x1b[m\n床前明月光\n%\n\n second \n%\n");
  EXPECT_EQ(docs_of(f, yuan::InputFormat::Auto), (std::vector<std::string>{"《静夜思》\n床前明月光", " second"}));
  std::string j = file("a.jsonl", "{\"text\": \"caf\\u00e9\\nbar\"}\n\n{\"text\": \"\", \"x\": 1}\n{\"text\": \"z\"}\n");
  EXPECT_EQ(docs_of(j, yuan::InputFormat::Auto), (std::vector<std::string>{"café\nbar", "z"}));
  std::string t = file("t.txt", "one\n\ntwo\nthree\n\n\n");
  EXPECT_EQ(docs_of(t, yuan::InputFormat::Auto), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(docs_of(t, yuan::InputFormat::Text, true), (std::vector<std::string>{"one", "two\nthree"}));
  // Whitespace alone is no document, in any format.
  std::string ws = file("ws.txt", "  \n\n \t\n");
  EXPECT_EQ(docs_of(ws, yuan::InputFormat::Text), std::vector<std::string>{});
  EXPECT_EQ(docs_of(ws, yuan::InputFormat::Text, true), std::vector<std::string>{});
  std::string ws_fortune = file("ws_fortunes", "\n \t\n%\n  \n%\nreal\n%\n");
  EXPECT_EQ(docs_of(ws_fortune, yuan::InputFormat::Fortune), std::vector<std::string>{"real"});
  std::string ws_jsonl = file("ws.jsonl", "{\"text\": \" \\n\\t\"}\n{\"text\": \"z\"}\n");
  EXPECT_EQ(docs_of(ws_jsonl, yuan::InputFormat::Auto), std::vector<std::string>{"z"});
  std::string sniffed = file("records", "{\"text\": \"a\"}\n");
  EXPECT_EQ(yuan::expand_inputs({sniffed}, yuan::InputFormat::Auto)[0].format, yuan::InputFormat::Jsonl);

  std::string bad = file("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  try {
    docs_of(bad, yuan::InputFormat::Auto);
    FAIL() << "no error";
  } catch (const yuan::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":2: bad JSON"), std::string::npos) << e.what();
  }
}

TEST_F(Prep, WordPieceIsGreedyLongestMatchWithCjkSplit) {
  std::string vocab = file("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nun\n##aff\n##able\n中\n文\n!\nplay\n##ing\n<eod>\n");
  auto tok = yuan::load_tokenizer(vocab);
  std::vector<uint32_t> ids;
  tok->encode("unaffable 中文! playing xyz 字", ids);
  EXPECT_EQ(ids, (std::vector<uint32_t>{4, 5, 6, 7, 8, 9, 10, 11, 1, 1}));
  EXPECT_EQ(tok->vocab_size(), 13);
  EXPECT_EQ(tok->eot_id(), 12);
  EXPECT_EQ(tok->name(), "wordpiece:sha256:" + yuan::sha256_file(vocab));
}

TEST_F(Prep, Sha256MatchesKnownDigests) {
  EXPECT_EQ(yuan::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(yuan::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(yuan::sha256_hex(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST_F(Prep, OutputIsTheSameForAnyThreadCountAndReadsEverywhere) {
  std::vector<std::string> in = corpus();
  std::vector<std::string> base = {"--input", in[0], dir_ + "/*.jsonl", in[2], "--train-tokenizer", "--vocab-size",
                                   "400", "--shard-tokens", "1500", "--val-fraction", "0.1", "--seed", "3"};
  for (const char* threads : {"1", "2"}) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--threads", threads, "--out", dir_ + "/out" + threads});
    prep(args);
  }
  for (const char* f : {"manifest.json", "tokenizer.model", "train_00000.h5", "val_00000.h5"})
    EXPECT_EQ(yuan::sha256_file(dir_ + "/out1/" + f), yuan::sha256_file(dir_ + "/out2/" + f)) << f << " differs";

  const std::string out = dir_ + "/out1";
  auto m = manifest(out);
  const int vocab = m.at("vocab_size").get<int>();
  EXPECT_LE(vocab, 400);
  EXPECT_EQ(m.at("tokenizer").get<std::string>(), "sentencepiece:sha256:" + yuan::sha256_file(out + "/tokenizer.model"));
  uint64_t docs = 0, train_tokens = 0;
  for (const char* split : {"train", "val"}) {
    for (const auto& s : m.at(split)) {
      std::string path = out + "/" + s.at("file").get<std::string>();
      EXPECT_EQ(s.at("sha256").get<std::string>(), yuan::sha256_file(path));
      docs += s.at("docs").get<uint64_t>();
      if (split[0] == 't') train_tokens += s.at("tokens").get<uint64_t>();
      // h5py sees the attributes the manifest promises, every id in range and a document start at each eot.
      std::string py = "/usr/bin/python3 -c \"import h5py, numpy as np; f = h5py.File('" + path +
                       "', 'r'); t = f['tokens'][:]; a = f.attrs; o = f['doc_offsets'][:]; "
                       "assert a['vocab_size'] == " + std::to_string(vocab) + " and t.max() < a['vocab_size']; "
                       "assert (t[o] == a['eot_id']).all() and len(o) == (t == a['eot_id']).sum(); "
                       "assert a['tokenizer'] == '" + m.at("tokenizer").get<std::string>() + "'\"";
      EXPECT_EQ(std::system(py.c_str()), 0) << path;
      EXPECT_EQ(std::system(("h5dump -H " + path + " > /dev/null").c_str()), 0) << path;
    }
  }
  EXPECT_EQ(docs, 120u);
  EXPECT_GT(m.at("val").size(), 0u);

  yuan::LoaderSpec s;
  s.glob = out + "/train_*.h5";
  s.seq_len = 64;
  s.vocab_size = vocab;
  s.global_batch = s.micro_batch = 2;
  yuan::TrainLoader l(s);
  EXPECT_EQ(l.windows() > 0 && l.windows() <= train_tokens / 64, true);
  const int32_t* b = l.next_micro_batch();
  for (int i = 0; i < 2 * 65; i++) EXPECT_LT(b[i], vocab);
}

TEST_F(Prep, ValDocsHoldsOutExactlyThatManyDocuments) {
  std::vector<std::string> in = corpus();
  // A tokenizer trained by one run and brought to the next by --tokenizer keeps its name.
  prep({"--input", in[2], "--train-tokenizer", "--vocab-size", "300", "--out", dir_ + "/tok", "--val-fraction", "0"});
  prep({"--input", in[0], in[1], "--tokenizer", dir_ + "/tok/tokenizer.model", "--val-docs", "7", "--out",
        dir_ + "/out", "--shard-tokens", "100000"});
  auto m = manifest(dir_ + "/out");
  ASSERT_EQ(m.at("val").size(), 1u);
  EXPECT_EQ(m.at("val").front().at("docs").get<int>(), 7);
  EXPECT_EQ(m.at("train").front().at("docs").get<int>(), 73);
  EXPECT_EQ(m.at("tokenizer").get<std::string>(), manifest(dir_ + "/tok").at("tokenizer").get<std::string>());
}

TEST_F(Prep, BadArgumentsAreOneLineErrors) {
  std::string glob = dir_ + "/nothing_*.txt";
  EXPECT_NE(error_of({"--input", glob, "--train-tokenizer", "--out", dir_ + "/o"}).find(glob), std::string::npos);
  std::string txt = file("a.txt", "hello\n");
  std::string model = dir_ + "/missing.model";
  EXPECT_NE(error_of({"--input", txt, "--tokenizer", model, "--out", dir_ + "/o"}).find(model), std::string::npos);
  EXPECT_NE(error_of({"--input", txt, "--out", dir_ + "/o"}).find("--train-tokenizer"), std::string::npos);
  EXPECT_NE(error_of({"--input", dir_, "--train-tokenizer", "--out", dir_ + "/o"}).find(dir_ + ": a directory"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", txt, "--bogus"}).find("bogus"), std::string::npos);
  EXPECT_EQ(yuan::prep_main({"--help"}), 0);
  EXPECT_NE(error_of({"--input", txt, "--train-tokenizer", "--character-coverage", "0.5", "--out", dir_ + "/o"})
                .find("--character-coverage 0.5"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/o"));
}

TEST_F(Prep, FindsTheFirstInvalidUtf8Sequence) {
  const size_t none = std::string::npos;
  auto at = [](const std::string& s) { return yuan::find_invalid_utf8(s); };
  // Well-formed: ASCII, 2-, 3- and 4-byte forms, the last code point before the surrogates, the first after
  // them, U+10FFFF.
  EXPECT_EQ(at(""), none);
  EXPECT_EQ(at("plain \t~\x7f"), none);
  EXPECT_EQ(at("caf\xc3\xa9 \xe5\xad\xa6 \xf0\x9f\x98\x80"), none);
  EXPECT_EQ(at("\xed\x9f\xbf\xee\x80\x80\xf4\x8f\xbf\xbf"), none);
  // A stray continuation byte, an invalid lead byte, the offset counted from the start.
  EXPECT_EQ(at("abc\x80"), 3u);
  EXPECT_EQ(at("\xc3\xa9\xbf"), 2u);
  EXPECT_EQ(at("ok\xff"), 2u);
  EXPECT_EQ(at("ok\xf5\x80\x80\x80"), 2u);
  // Overlong forms of '/' (C0 AF, E0 80 AF, F0 80 80 AF) and of U+07FF in three bytes.
  EXPECT_EQ(at("a\xc0\xaf"), 1u);
  EXPECT_EQ(at("a\xc1\xbf"), 1u);
  EXPECT_EQ(at("ab\xe0\x80\xaf"), 2u);
  EXPECT_EQ(at("ab\xe0\x9f\xbf"), 2u);
  EXPECT_EQ(at("\xf0\x80\x80\xaf"), 0u);
  EXPECT_EQ(at("\xf0\x8f\xbf\xbf"), 0u);
  // UTF-16 surrogates U+D800 and U+DFFF, and U+110000.
  EXPECT_EQ(at("x\xed\xa0\x80"), 1u);
  EXPECT_EQ(at("xy\xed\xbf\xbf"), 2u);
  EXPECT_EQ(at("\xf4\x90\x80\x80"), 0u);
  // Sequences cut short: at the end, and by an ASCII byte in the middle.
  EXPECT_EQ(at("abc\xe5\xad"), 3u);
  EXPECT_EQ(at("abc\xf0\x9f\x98"), 3u);
  EXPECT_EQ(at("abc\xc3"), 3u);
  EXPECT_EQ(at("\xe5\xadz\xe5\xad\xa6"), 0u);
  EXPECT_EQ(at("\xe5\xad\xa6\xf0\x9f\x98z"), 3u);
  // NUL is valid UTF-8 but no text holds it.
  EXPECT_EQ(at(std::string("ab\0c", 4)), 2u);
  // The first of several.
  EXPECT_EQ(at("\xc3\xa9z\x80\xff\xc0"), 3u);
}

TEST_F(Prep, InputThatIsNotUtf8TextIsRefusedWithFileAndOffset) {
  // The offset counts every byte of the file, including the CR LF of the lines before.
  std::string latin1 = file("latin1.txt", "one\r\ntwo\ncaf\xe9 au lait\n");
  std::string e = yuan::testing::error_of([&] { docs_of(latin1, yuan::InputFormat::Auto); });
  EXPECT_NE(e.find(latin1 + ": not UTF-8 text"), std::string::npos) << e;
  EXPECT_NE(e.find("byte offset 12 (line 3), starting 0xE9"), std::string::npos) << e;

  std::string binary = file("blob", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  e = yuan::testing::error_of([&] { docs_of(binary, yuan::InputFormat::Auto); });
  EXPECT_NE(e.find(binary + ": not UTF-8 text: a NUL byte at byte offset 7 (line 1)"), std::string::npos) << e;

  // A truncated character at the very end, in the second of two files; and inside a JSON Lines "text".
  std::string good = file("good.txt", "\xe5\xad\xa6\n");
  std::string cut = file("cut.txt", "\xe5\xad\xa6\n\xe5\xad");
  e = yuan::testing::error_of([&] {
    yuan::Documents d(yuan::expand_inputs({good, cut}, yuan::InputFormat::Auto), false);
    for (std::string s; d.next(s);) {
    }
  });
  EXPECT_NE(e.find(cut + ": not UTF-8 text: an invalid sequence at byte offset 4 (line 2)"), std::string::npos) << e;
  std::string jsonl = file("x.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xed\xa0\x80\"}\n");
  e = yuan::testing::error_of([&] { docs_of(jsonl, yuan::InputFormat::Auto); });
  EXPECT_NE(e.find(jsonl + ": not UTF-8 text: an invalid sequence at byte offset 25 (line 2)"), std::string::npos)
      << e;
}

TEST_F(Prep, AFailedPrepLeavesThePreviousCorpusAsItWas) {
  std::vector<std::string> in = corpus();
  const std::string out = dir_ + "/out";
  prep({"--input", in[2], "--train-tokenizer", "--vocab-size", "300", "--shard-tokens", "300", "--out", out});
  const auto before = snapshot(out);
  ASSERT_GT(before.size(), 4u);
  const std::string binary = file("blob.gz", std::string("\x1f\x8b\x08\x00", 4));
  const std::string bad_json = file("bad.jsonl", "{\"text\": \"a\"}\n{oops\n");
  const std::string cjk = file("cjk.txt", distinct_cjk(3000));
  const std::string blank = file("blank.txt", "  \n\n \t\n");
  const auto names = entries();
  const std::string tok = out + "/tokenizer.model";
  const std::vector<std::vector<std::string>> failures = {
      {"--input", in[2], "--tokenizer", dir_ + "/nonexistent.model", "--out", out},  // the issue's case
      {"--input", binary, "--tokenizer", tok, "--out", out},
      {"--input", in[2], binary, "--train-tokenizer", "--vocab-size", "300", "--out", out},
      {"--input", in[0], bad_json, "--tokenizer", tok, "--out", out},
      {"--input", in[2], "--tokenizer", tok, "--val-docs", "1000", "--out", out},
      {"--input", cjk, "--train-tokenizer", "--vocab-size", "300", "--out", out},
      {"--input", blank, "--tokenizer", tok, "--out", out},
      {"--input", blank, "--train-tokenizer", "--vocab-size", "300", "--out", out},
  };
  for (const auto& args : failures) {
    const std::string e = error_of(args);
    EXPECT_NE(e, "") << args[1];
    EXPECT_EQ(snapshot(out), before) << e;
    EXPECT_EQ(entries(), names) << e;  // no unfinished directory left beside it
  }
}

TEST_F(Prep, ASuccessfulPrepReplacesTheCorpusWhole) {
  std::vector<std::string> in = corpus();
  const std::string out = dir_ + "/out";
  prep({"--input", in[2], "--train-tokenizer", "--vocab-size", "300", "--shard-tokens", "300", "--out", out});
  ASSERT_TRUE(fs::exists(out + "/train_00003.h5"));
  // Again from its own tokenizer, into the same directory, with fewer and larger shards: none of the old is left,
  // and the tokenizer the manifest names is there although it came from the directory being replaced.
  prep({"--input", in[0], in[2], "--tokenizer", out + "/tokenizer.model", "--shard-tokens", "100000", "--val-docs",
        "5", "--out", out + "/"});
  auto m = manifest(out);
  std::map<std::string, std::string> listed = {{"manifest.json", yuan::sha256_file(out + "/manifest.json")}};
  for (const char* split : {"train", "val"})
    for (const auto& s : m.at(split)) listed[s.at("file").get<std::string>()] = s.at("sha256").get<std::string>();
  const std::string tok = m.at("tokenizer_file").get<std::string>();
  listed[tok] = yuan::sha256_file(out + "/" + tok);
  EXPECT_EQ(snapshot(out), listed);
  EXPECT_EQ(m.at("tokenizer").get<std::string>(), "sentencepiece:sha256:" + listed[tok]);
  EXPECT_EQ(m.at("sources").size(), 2u);
  EXPECT_EQ(entries(), (std::vector<std::string>{"books.txt", "out", "poems", "web.jsonl"}));
}

TEST_F(Prep, OutputThatIsNotPrepsIsRefusedNotReplaced) {
  std::string txt = file("a.txt", "hello world\n");
  const std::string tok_dir = dir_ + "/tok";
  prep({"--input", txt, "--train-tokenizer", "--vocab-size", "300", "--out", tok_dir});
  const std::string tok = tok_dir + "/tokenizer.model";
  std::string notes = file("tok/notes.txt", "mine");
  std::string e = error_of({"--input", txt, "--tokenizer", tok, "--out", tok_dir});
  EXPECT_NE(e.find("--out " + tok_dir + " holds 'notes.txt', which prep does not write"), std::string::npos) << e;
  EXPECT_TRUE(fs::exists(notes));
  e = error_of({"--input", txt, "--tokenizer", tok, "--out", txt});
  EXPECT_NE(e.find("--out " + txt + " exists and is not a directory"), std::string::npos) << e;
  // A symlink to a corpus: the corpus is replaced, the link stays a link.
  fs::remove(notes);
  fs::create_directory_symlink(tok_dir, dir_ + "/link");
  prep({"--input", txt, "--tokenizer", tok, "--val-fraction", "0", "--out", dir_ + "/link"});
  EXPECT_TRUE(fs::is_symlink(dir_ + "/link"));
  EXPECT_EQ(manifest(tok_dir).at("sources").at(0).at("docs").get<int>(), 1);
}

TEST_F(Prep, WhatAKilledPrepLeftIsCleanedUpByTheNext) {
  std::string txt = file("a.txt", "hello world\n");
  const std::string out = dir_ + "/out";
  prep({"--input", txt, "--train-tokenizer", "--vocab-size", "300", "--val-fraction", "0", "--out", out});
  const auto corpus = snapshot(out);
  // Killed while writing: its staging directory is removed. Killed between the two renames of the swap on a
  // file system without RENAME_EXCHANGE: the previous corpus, moved aside, is put back (and survives this
  // prep's own failure).
  const std::string stale = dir_ + "/" + sibling("out", "tmp", dead_pid());
  fs::create_directory(stale);
  file(fs::path(stale).filename().string() + "/train_00000.h5", "partial");
  const std::string aside = dir_ + "/" + sibling("out", "old", dead_pid());
  fs::rename(out, aside);
  const std::string binary = file("blob", std::string("a\0", 2));
  EXPECT_NE(error_of({"--input", binary, "--tokenizer", aside + "/tokenizer.model", "--out", out}), "");
  EXPECT_EQ(snapshot(out), corpus);
  EXPECT_EQ(entries(), (std::vector<std::string>{"a.txt", "blob", "out"}));
  // A sibling from another host may belong to a prep that still runs there: left alone.
  const std::string remote = dir_ + "/.out.tmp-1@another-host";
  fs::create_directory(remote);
  prep({"--input", txt, "--tokenizer", out + "/tokenizer.model", "--val-fraction", "0", "--out", out});
  EXPECT_TRUE(fs::exists(remote));
}

// The names prep and export stage their output under: what a later run reads back from them, and when it may
// take the directory for one a killed process left.
TEST_F(Prep, StagingDirNamesSayWhoMadeThemAndWhetherThatProcessIsGone) {
  const std::string mine = yuan::staging_dir_name("out", "tmp", "node7");
  EXPECT_EQ(mine, ".out.tmp-" + std::to_string(getpid()) + "@node7");
  const auto s = yuan::parse_staging_dir_name(mine, "out");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, "tmp");
  EXPECT_EQ(s->pid, getpid());
  EXPECT_EQ(s->host, "node7");
  // NAME is matched whole, whatever it holds; HOST is all after the '@'.
  const auto other = yuan::parse_staging_dir_name(".hf-1@v2.export-123456789@a.example.org", "hf-1@v2");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->kind, "export");
  EXPECT_EQ(other->pid, 123456789);
  EXPECT_EQ(other->host, "a.example.org");
  for (const char* entry : {"out", ".out", ".out.tmp", ".outx.tmp-1@h", ".other.tmp-1@h", ".out.-1@h", ".out.tmp-@h",
                            ".out.tmp-12", ".out.tmp-1x@h", ".out.tmp--1@h", ".out.tmp@h-1", ".out.tmp-1234567890@h"})
    EXPECT_FALSE(yuan::parse_staging_dir_name(entry, "out")) << entry;

  // Gone: only a pid of this host that no process has. A pid on another host says nothing, dead here or not.
  const long dead = dead_pid();
  EXPECT_TRUE(yuan::staging_owner_gone({"tmp", "node7", dead}, "node7"));
  EXPECT_FALSE(yuan::staging_owner_gone({"tmp", "node7", getpid()}, "node7"));
  EXPECT_FALSE(yuan::staging_owner_gone({"tmp", "node7", dead}, "node8"));
}

TEST_F(Prep, TokenizerTrainingFailuresSayWhatIsWrongInPrepsTerms) {
  // 98% of the text (the least coverage SentencePiece accepts) is 2940 distinct characters, far more than 300
  // ids hold. The trainer itself would name its --character_coverage, which prep users never set.
  std::string cjk = file("cjk.txt", distinct_cjk(3000));
  std::string e = error_of({"--input", cjk, "--train-tokenizer", "--vocab-size", "300", "--out", dir_ + "/o"});
  EXPECT_NE(e.find("--vocab-size 300 is too small for " + cjk), std::string::npos) << e;
  EXPECT_NE(e.find("needs --vocab-size "), std::string::npos) << e;
  EXPECT_EQ(e.find("character_coverage"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir_ + "/o"));
  // A vocabulary that holds them all trains.
  const int needed = std::stoi(e.substr(e.find("needs --vocab-size ") + 19));
  prep({"--input", cjk, "--train-tokenizer", "--vocab-size", std::to_string(needed), "--val-fraction", "0", "--out",
        dir_ + "/o"});
}

}  // namespace
