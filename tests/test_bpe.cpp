// Byte-level BPE (src/prep/bpe.cpp) against HuggingFace `tokenizers`: tests/data/bpe holds a small GPT-2-style
// tokenizer trained with it, the same as vocab.json + merges.txt, a Llama-3-style variant (Split with its own
// pattern, ignore_merges), and adversarial texts with the ids HF gives (written by tools/make_bpe_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "data/shard.h"
#include "prep/prep.h"
#include "prep/tokenizer.h"
#include "test_util.h"
#include "util/fs.h"
#include "util/sha256.h"

namespace fs = std::filesystem;

namespace {

const std::string kData = "tests/data/bpe";  // tests run from the repository root

struct Case {
  std::string text;
  std::vector<uint32_t> ids, split_ids;
};

std::vector<Case> cases() {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(kData + "/cases.json"));
  std::vector<Case> out;
  for (const auto& c : j.at("cases"))
    out.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<uint32_t>>(),
                   c.at("split_ids").get<std::vector<uint32_t>>()});
  return out;
}

std::vector<uint32_t> encode(const yuan::Tokenizer& tok, const std::string& text) {
  std::vector<uint32_t> ids;
  tok.encode(text, ids);
  return ids;
}

// Every case gives HF's ids, and the ids decode to the text.
void expect_oracle(const std::string& path, bool split) {
  auto tok = yuan::load_tokenizer(path);
  int n = 0;
  for (const Case& c : cases()) {
    const std::vector<uint32_t>& want = split ? c.split_ids : c.ids;
    EXPECT_EQ(encode(*tok, c.text), want) << path << ": case " << n << ": " << c.text.substr(0, 60);
    // The fixture's eot is id 0 and stands in some texts; decode skips it, so only eot-free texts come back whole.
    if (std::find(want.begin(), want.end(), 0u) == want.end()) {
      EXPECT_EQ(tok->decode(want), c.text) << path << ": case " << n;
    }
    n++;
  }
  EXPECT_GT(n, 100);
}

class Bpe : public yuan::testing::TempDirTest {
 protected:
  static std::string error_of(const std::string& path) {
    return yuan::testing::error_of([&] { yuan::load_tokenizer(path); });
  }
  // tests/data/bpe/tokenizer.json with `edit` applied, as DIR/NAME.
  std::string edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) const {
    nlohmann::json t = nlohmann::json::parse(std::ifstream(kData + "/tokenizer.json"));
    edit(t);
    return file(name, t.dump());
  }
};

TEST_F(Bpe, TokenizerJsonGivesHuggingFacesIds) {
  expect_oracle(kData + "/tokenizer.json", false);
  auto tok = yuan::load_tokenizer(kData + "/tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 800);
  EXPECT_EQ(tok->eot_id(), 0);
  EXPECT_EQ(tok->name(), "bpe:sha256:" + yuan::sha256_file(kData + "/tokenizer.json"));
  // As tokenizers before 0.9 wrote it (GPT-2's tokenizer.json on the HF hub): no model type, merges as strings.
  expect_oracle(edited("old.json",
                       [](nlohmann::json& t) {
                         t["model"].erase("type");
                         for (auto& m : t["model"]["merges"])
                           m = m[0].get<std::string>() + " " + m[1].get<std::string>();
                       }),
                false);
}

TEST_F(Bpe, VocabJsonAndMergesTxtGiveTheSameIdsWhicheverIsNamed) {
  expect_oracle(kData + "/vocab.json", false);
  expect_oracle(kData + "/merges.txt", false);
  // Both name the one tokenizer.json prep stores for the pair.
  const auto stored = yuan::stored_tokenizer(kData + "/merges.txt");
  EXPECT_EQ(stored.extension, ".json");
  EXPECT_EQ(yuan::load_tokenizer(kData + "/vocab.json")->name(), "bpe:sha256:" + yuan::sha256_hex(stored.text));
  EXPECT_EQ(yuan::load_tokenizer(kData + "/merges.txt")->name(), "bpe:sha256:" + yuan::sha256_hex(stored.text));
  expect_oracle(file("tokenizer.json", stored.text), false);
}

TEST_F(Bpe, IdsThatCutCharactersDecodeAsHuggingFaceDecodesThem) {
  auto tok = yuan::load_tokenizer(kData + "/tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(kData + "/cases.json"));
  int n = 0;
  for (const auto& c : j.at("decode")) {
    EXPECT_EQ(tok->decode(c.at("ids").get<std::vector<uint32_t>>()), c.at("text").get<std::string>()) << "case " << n;
    n++;
  }
  EXPECT_GT(n, 100);
  EXPECT_EQ(tok->decode({}), "");
}

TEST_F(Bpe, SplitPreTokenizerWithItsOwnPatternGivesHuggingFacesIds) {
  expect_oracle(kData + "/tokenizer_split.json", true);
}

TEST_F(Bpe, AddedTokensAreSplitOutLeftmostLongestSpecialOnesFirst) {
  const nlohmann::json added = nlohmann::json::parse(std::ifstream(kData + "/cases.json")).at("added");
  auto tok = yuan::load_tokenizer(
      edited("added.json", [&](nlohmann::json& t) { t["added_tokens"] = added["added_tokens"]; }));
  EXPECT_EQ(tok->vocab_size(), 805);
  int n = 0;
  for (const auto& c : added.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(encode(*tok, text), c.at("ids").get<std::vector<uint32_t>>()) << text;
    n++;
  }
  EXPECT_EQ(n, 7);
}

TEST_F(Bpe, SplitPatternsThatMatchNothingCutWhereTheyMatch) {
  const nlohmann::json cases = nlohmann::json::parse(std::ifstream(kData + "/cases.json")).at("empty_matches");
  int n = 0;
  for (const auto& c : cases) {
    const std::string pattern = c.at("pattern").get<std::string>(), text = c.at("text").get<std::string>();
    auto tok = yuan::load_tokenizer(edited("empty.json", [&](nlohmann::json& t) {
      t["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}},
                                                {"behavior", "Isolated"}, {"invert", false}},
                                               {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    }));
    EXPECT_EQ(encode(*tok, text), c.at("ids").get<std::vector<uint32_t>>()) << pattern << " on " << text;
    n++;
  }
  EXPECT_EQ(n, 30);
}

TEST_F(Bpe, ManyThreadsEncodeAsOne) {
  auto tok = yuan::load_tokenizer(kData + "/tokenizer.json");
  const std::vector<Case> all = cases();
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; rep++)
        for (const Case& c : all) wrong[t] += encode(*tok, c.text) != c.ids;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST_F(Bpe, LongRunsOfOneCharacterClass) {
  auto tok = yuan::load_tokenizer(kData + "/tokenizer.json");
  for (const std::string& s : {std::string(200000, ' ') + "x", std::string(200000, '\n'), std::string(200000, '7'),
                               std::string(100000, 'a') + "!"}) {
    const std::vector<uint32_t> ids = encode(*tok, s);
    EXPECT_EQ(tok->decode(ids), s);
  }
}

// A Split pattern repeating a group with alternatives needs more than PCRE2's default JIT stack on a long word.
TEST_F(Bpe, AGroupRepeatedOverALongWordMatches) {
  auto tok = yuan::load_tokenizer(edited("group.json", [](nlohmann::json& t) {
    t["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(?:\\p{L}|\\p{N})+"}}},
                                              {"behavior", "Isolated"}, {"invert", false}},
                                             {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  }));
  const std::string word = std::string(300000, 'a') + " b";
  EXPECT_EQ(tok->decode(encode(*tok, word)), word);
}

TEST_F(Bpe, InvalidUtf8IsRefusedWithItsOffset) {
  auto tok = yuan::load_tokenizer(kData + "/tokenizer.json");
  std::vector<uint32_t> ids;
  for (const std::string& bad : {std::string("ok \xff"), std::string("ok \xc3"), std::string("ok \xed\xa0\x80"),
                                 std::string("ok \xc0\xaf")}) {
    const std::string e = yuan::testing::error_of([&] { tok->encode(bad, ids); });
    EXPECT_NE(e.find("not UTF-8 (an invalid sequence at byte offset 3)"), std::string::npos) << e;
  }
}

TEST_F(Bpe, WhatIsNotByteLevelBpeIsRefusedNamingFileAndKey) {
  using nlohmann::json;
  const std::vector<std::pair<std::function<void(json&)>, std::string>> edits = {
      {[](json& t) { t["model"]["type"] = "WordPiece"; }, ".model.type: expected BPE, found \"WordPiece\""},
      {[](json& t) { t["model"] = {{"type", "Unigram"}, {"vocab", json::array()}}; }, ".model.type: expected BPE"},
      {[](json& t) { t["normalizer"] = {{"type", "NFC"}}; }, ".normalizer: expected null"},
      {[](json& t) { t["model"]["dropout"] = 0.1; }, ".model.dropout: expected null, found 0.1"},
      {[](json& t) { t["model"]["continuing_subword_prefix"] = "##"; }, ".model.continuing_subword_prefix"},
      {[](json& t) { t["model"]["end_of_word_suffix"] = "</w>"; }, ".model.end_of_word_suffix"},
      {[](json& t) { t["pre_tokenizer"] = {{"type", "Whitespace"}}; }, ".pre_tokenizer.type: expected ByteLevel last"},
      {[](json& t) { t["pre_tokenizer"]["add_prefix_space"] = true; },
       ".pre_tokenizer.add_prefix_space: expected false, found true"},
      {[](json& t) { t["decoder"] = {{"type", "WordPiece"}}; },
       ".decoder.type: expected ByteLevel, found \"WordPiece\""},
      {[](json& t) { t["pre_tokenizer"] = nullptr; }, ".pre_tokenizer: expected ByteLevel, or a Sequence"},
      {[](json& t) { t["added_tokens"][0]["rstrip"] = "yes"; },
       ".added_tokens[0].rstrip: expected false, found \"yes\""},
      {[](json& t) { t["model"]["vocab"]["!"] = "1"; },
       ".model.vocab[\"!\"]: expected an id in [0, 2^31), found \"1\""},
      {[](json& t) { t["post_processor"] = {{"type", "TemplateProcessing"}}; }, ".post_processor.type: expected"},
      {[](json& t) { t["added_tokens"][0]["lstrip"] = true; }, ".added_tokens[0].lstrip: expected false"},
      {[](json& t) { t["model"]["vocab"].erase("Ġ"); }, ".model.vocab: expected a token for every byte"},
      {[](json& t) { t["model"]["merges"][0] = "Ġt"; }, ".model.merges[0]: expected \"LEFT RIGHT\""},
      {[](json& t) { t["truncation"] = {{"max_length", 8}}; }, ".truncation: expected null"},
      {[](json& t) {
         t["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}},
                                                   {"behavior", "Removed"}, {"invert", false}},
                                                  {{"type", "ByteLevel"}, {"use_regex", false}}}}};
       },
       ".pre_tokenizer.pretokenizers[0].behavior: expected \"Isolated\", found \"Removed\""},
      {[](json& t) {
         t["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L"}}},
                                                   {"behavior", "Isolated"}, {"invert", false}},
                                                  {{"type", "ByteLevel"}, {"use_regex", false}}}}};
       },
       ".pre_tokenizer.pretokenizers[0].pattern: cannot compile pattern at offset"},
  };
  int i = 0;
  for (const auto& [edit, want] : edits) {
    const std::string path = edited("t" + std::to_string(i++) + ".json", edit);
    const std::string e = error_of(path);
    EXPECT_EQ(e.rfind(path + ": ", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST_F(Bpe, AMissingHalfOfThePairIsNamed) {
  file("gpt2-vocab.json", yuan::read_text(kData + "/vocab.json"));
  file("gpt2-merges.txt", yuan::read_text(kData + "/merges.txt"));
  EXPECT_EQ(yuan::load_tokenizer(path("gpt2-vocab.json"))->name(),
            yuan::load_tokenizer(kData + "/vocab.json")->name());
  fs::remove(path("gpt2-merges.txt"));
  EXPECT_NE(error_of(path("gpt2-vocab.json")).find(path("gpt2-merges.txt") + " is missing"), std::string::npos);
  file("merges.txt", yuan::read_text(kData + "/merges.txt"));
  EXPECT_NE(error_of(path("merges.txt")).find(path("vocab.json") + " is missing"), std::string::npos);
  file("other.json", "{\"a\": 1}");
  EXPECT_NE(error_of(path("other.json")).find("expected a HuggingFace tokenizer.json"), std::string::npos);
}

// prep end to end: documents separated by the eot, the tokenizer stored as one tokenizer.json (also for the pair)
// that decodes the shards back to the documents.
TEST_F(Bpe, PrepStoresTheTokenizerAndItsShardsDecodeToTheDocuments) {
  const std::vector<std::string> docs = {"It's a test: 123 and 4567.", "床前明月光，疑是地上霜。",
                                         "emoji 👨‍👩‍👧‍👦 and <|endoftext|> inside", "  spaces\tand\ttabs  "};
  std::string jsonl;
  for (const std::string& d : docs) jsonl += nlohmann::json{{"text", d}}.dump() + "\n";
  const std::string in = file("docs.jsonl", jsonl);
  for (const char* given : {"tokenizer.json", "vocab.json"}) {
    const std::string out = path(std::string("out-") + given);
    EXPECT_EQ(yuan::prep_main({"--input", in, "--tokenizer", kData + "/" + given, "--out", out, "--val-fraction", "0",
                               "--threads", "2"}),
              0);
    const nlohmann::json m = nlohmann::json::parse(std::ifstream(out + "/manifest.json"));
    EXPECT_EQ(m.at("tokenizer_file"), "tokenizer.json");
    EXPECT_EQ(m.at("tokenizer"), "bpe:sha256:" + yuan::sha256_file(out + "/tokenizer.json"));
    EXPECT_EQ(m.at("eot_id"), 0);
    auto tok = yuan::load_tokenizer(out + "/tokenizer.json");
    EXPECT_EQ(tok->name(), m.at("tokenizer"));
    yuan::ShardReader r(out + "/train_00000.h5", 1);
    std::vector<int32_t> t(r.tokens());
    r.read(0, t.size(), t.data());
    std::vector<uint32_t> expect;
    for (const std::string& d : docs) {
      expect.push_back(0);
      tok->encode(d, expect);
    }
    EXPECT_EQ(std::vector<uint32_t>(t.begin(), t.end()), expect) << given;
    // Documents split at their eot; the one holding the literal <|endoftext|> splits there too.
    std::string all;
    for (const std::string& d : docs) all += d;
    size_t cut = all.find("<|endoftext|>");
    all.erase(cut, 13);
    EXPECT_EQ(tok->decode(expect), all);
  }
}

}  // namespace
