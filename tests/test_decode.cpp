// Tokenizer::decode, which `yuanlm sample` prints through: it inverts encode on text each tokenizer can
// represent, skips the eot id, and rejects ids outside the vocabulary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "prep/documents.h"
#include "prep/tokenizer.h"
#include "test_util.h"
#include "util/error.h"


namespace {

class Decode : public yuan::testing::TempDirTest {};

std::vector<uint32_t> encode(const yuan::Tokenizer& t, const std::string& s) {
  std::vector<uint32_t> ids;
  t.encode(s, ids);
  return ids;
}

TEST_F(Decode, WordPieceJoinsContinuationsAndCjkWithoutSpaces) {
  auto t = yuan::load_tokenizer(file("vocab.txt", "[UNK]\n<eod>\nthe\nmodel\n##s\nread\n学\n习\n数\n据\n.\n"));
  const std::string text = "the models read 学习数据 .";
  std::vector<uint32_t> ids = encode(*t, text);
  ASSERT_EQ(ids.size(), 9u);
  EXPECT_EQ(t->decode(ids), text);
  ids.insert(ids.begin(), static_cast<uint32_t>(t->eot_id()));  // <eod> is skipped
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->decode(encode(*t, "the 学习")), "the 学习");
  EXPECT_THROW(t->decode({static_cast<uint32_t>(t->vocab_size())}), yuan::Error);
}

TEST_F(Decode, SentencePieceRoundTripsAndSkipsEot) {
  std::string text;
  for (int i = 0; i < 200; i++) text += "every rank reads its slice of the 数据 window " + std::to_string(i) + ".\n";
  yuan::Documents docs(yuan::expand_inputs({file("corpus.txt", text)}, yuan::InputFormat::Text), false);
  yuan::SentencePieceTraining opt;
  opt.vocab_size = 300;
  const std::string model = dir_ + "/tok.model";
  yuan::train_sentencepiece(docs, opt, model);
  auto t = yuan::load_tokenizer(model);
  // byte fallback spells characters outside the pieces as UTF-8 bytes, and decode puts them back together
  for (const std::string s : {"every rank reads 42 windows.", "模型 reads 数据 ü"}) {
    std::vector<uint32_t> ids = {static_cast<uint32_t>(t->eot_id())};
    t->encode(s, ids);
    EXPECT_EQ(t->decode(ids), s);
  }
  EXPECT_THROW(t->decode({static_cast<uint32_t>(t->vocab_size())}), yuan::Error);
}

}  // namespace
