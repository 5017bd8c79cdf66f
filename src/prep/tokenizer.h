// Tokenizers for `yuanlm prep` (encode) and `yuanlm sample` (decode): a SentencePiece model (trained here or
// brought along), a Yuan-style WordPiece vocab.txt, or a GPT-2-style byte-level BPE (prep/bpe.h). Each is named
// "<kind>:sha256:<hex of the file>", the name every shard carries so that shards from different tokenizers are
// never mixed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "prep/documents.h"

namespace yuan {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text`; safe to call from many threads at once.
  virtual void encode(const std::string& text, std::vector<uint32_t>& out) const = 0;
  // The text of `ids`. The eot id is skipped (a document boundary has no text of its own); an id outside
  // [0, vocab_size) throws.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  int vocab_size() const { return vocab_size_; }
  int eot_id() const { return eot_id_; }  // the id written before every document
  const std::string& name() const { return name_; }

 protected:
  void check_id(uint32_t id) const;
  int vocab_size_ = 0, eot_id_ = 0;
  std::string name_;
};

// `*.model`: SentencePiece; eot is its eos id, or a dedicated id = piece count when the model has no eos.
// `*.json`, `*merges.txt`, `*vocab.bpe`: byte-level BPE, a HuggingFace tokenizer.json or one half of GPT-2's
// vocab.json + merges.txt pair; eot is <|endoftext|> when present, else a dedicated id.
// Anything else: a WordPiece vocab.txt, one piece per line; eot is "<eod>" when present, else a dedicated id.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The tokenizer as prep stores it beside the shards, "tokenizer" + extension: the bytes whose sha256 its name
// carries. The file itself, except that GPT-2's vocab.json + merges.txt pair becomes the one tokenizer.json it
// amounts to, so that a single file travels into every checkpoint.
struct StoredTokenizer {
  std::string extension, text;
};
StoredTokenizer stored_tokenizer(const std::string& path);

// SentencePiece's own limit: its trainer refuses a lower character coverage.
constexpr double kMinCharacterCoverage = 0.98;

struct SentencePieceTraining {
  int vocab_size = 32000;
  // 0: the characters may take at most 3/4 of the non-byte ids (but SentencePiece covers at least 98% of them)
  double character_coverage = 0;
  uint64_t sentences = 1000000;  // lines sampled from the input (reservoir, seeded): bounds time and memory
  uint64_t seed = 1;
  std::string input;  // the input as messages name it (the --input arguments)
};
// Trains a byte-fallback BPE model on the lines of `docs` and writes it atomically to `model_path`. A failure is
// an Error in prep's terms (--vocab-size, --character-coverage, the input), not SentencePiece's option names.
void train_sentencepiece(Documents& docs, const SentencePieceTraining& opt, const std::string& model_path);

}  // namespace yuan
