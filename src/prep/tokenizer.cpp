#include "prep/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <unordered_map>

#include "prep/bpe.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/sha256.h"

namespace yuan {

namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    auto st = sp_.Load(path);
    YUAN_CHECK(st.ok(), "%s: not a SentencePiece model: %s", path.c_str(), st.ToString().c_str());
    vocab_size_ = sp_.GetPieceSize();
    eot_id_ = sp_.eos_id() >= 0 ? sp_.eos_id() : vocab_size_++;
    name_ = "sentencepiece:sha256:" + sha256_file(path);
  }
  void encode(const std::string& text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    YUAN_CHECK(st.ok(), "sentencepiece: cannot encode: %s", st.ToString().c_str());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::vector<int> keep;
    for (uint32_t id : ids) {
      check_id(id);
      if (static_cast<int>(id) != eot_id_) keep.push_back(static_cast<int>(id));
    }
    std::string text;
    auto st = sp_.Decode(keep, &text);
    YUAN_CHECK(st.ok(), "sentencepiece: cannot decode: %s", st.ToString().c_str());
    return text;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

// Decodes one UTF-8 code point at s[i], advancing i; malformed bytes come back as themselves.
uint32_t next_codepoint(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : c & (0x7f >> len);
  for (int k = 1; k < len; k++) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2FA1F) ||
         (c >= 0xF900 && c <= 0xFAFF);
}

bool is_punct(uint32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
         (c >= 0x2000 && c <= 0x206F) || (c >= 0x3000 && c <= 0x303F) || (c >= 0xFF01 && c <= 0xFF0F) ||
         (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65);
}

// Scripts written without spaces: CJK ideographs and the CJK/full-width punctuation between them.
bool is_unspaced(uint32_t c) { return is_cjk(c) || (c >= 0x3000 && c <= 0x303F) || (c >= 0xFF00 && c <= 0xFFEF); }

uint32_t last_codepoint(const std::string& s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) i--;
  if (i > 0) i--;
  return next_codepoint(s, i);
}

bool is_space(uint32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x3000 || c == 0xA0; }

// BERT/Yuan WordPiece: text splits at whitespace, and every CJK character and punctuation mark is a word of
// its own; each word is then cut greedily into the longest vocabulary pieces, continuations written "##piece".
// A word that cannot be cut completely becomes [UNK], as in BERT.
class WordPieceTokenizer : public Tokenizer {
 public:
  explicit WordPieceTokenizer(const std::string& path) {
    std::ifstream in(path);
    YUAN_CHECK(in, "%s: cannot open tokenizer vocabulary: %s", path.c_str(), std::strerror(errno));
    std::string line;
    for (int id = 0; std::getline(in, line); id++) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      ids_.emplace(line, id);  // the first occurrence of a duplicate wins
      pieces_.push_back(line);
      vocab_size_ = id + 1;
    }
    YUAN_CHECK(vocab_size_ > 0, "%s: empty tokenizer vocabulary", path.c_str());
    auto unk = ids_.find("[UNK]");
    YUAN_CHECK(unk != ids_.end(), "%s: WordPiece vocabulary has no [UNK] token", path.c_str());
    unk_ = unk->second;
    auto eod = ids_.find("<eod>");
    eot_id_ = eod != ids_.end() ? eod->second : vocab_size_++;
    name_ = "wordpiece:sha256:" + sha256_file(path);
  }

  void encode(const std::string& text, std::vector<uint32_t>& out) const override {
    std::string word;
    for (size_t i = 0; i < text.size();) {
      size_t start = i;
      uint32_t c = next_codepoint(text, i);
      if (is_space(c) || is_cjk(c) || is_punct(c)) {
        encode_word(word, out);
        word.clear();
        if (!is_space(c)) encode_word(text.substr(start, i - start), out);
      } else {
        word.append(text, start, i - start);
      }
    }
    encode_word(word, out);
  }

  // Pieces joined by spaces, "##" continuations glued to the piece before, and no space between two CJK
  // characters (encode made each one a word). Spaces the text had elsewhere, e.g. around punctuation, are
  // not recoverable.
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string text;
    for (uint32_t id : ids) {
      check_id(id);
      if (static_cast<int>(id) == eot_id_) continue;
      const std::string& p = pieces_[id];
      if (p.size() > 2 && p.compare(0, 2, "##") == 0) {
        text.append(p, 2, std::string::npos);
        continue;
      }
      size_t i = 0;
      if (!text.empty() && !p.empty() && !(is_unspaced(last_codepoint(text)) && is_unspaced(next_codepoint(p, i))))
        text += ' ';
      text += p;
    }
    return text;
  }

 private:
  void encode_word(const std::string& w, std::vector<uint32_t>& out) const {
    if (w.empty()) return;
    size_t mark = out.size();
    if (w.size() <= kMaxWordBytes) {
      for (size_t start = 0; start < w.size();) {
        size_t end = w.size();
        for (; end > start; end--) {
          if (end < w.size() && (static_cast<unsigned char>(w[end]) & 0xC0) == 0x80) continue;  // mid-character
          auto it = ids_.find(start == 0 ? w.substr(0, end) : "##" + w.substr(start, end - start));
          if (it != ids_.end()) {
            out.push_back(it->second);
            break;
          }
        }
        if (end == start) break;
        start = end;
        if (start == w.size()) return;
      }
    }
    out.resize(mark);
    out.push_back(unk_);
  }

  static constexpr size_t kMaxWordBytes = 400;  // BERT's 100 characters, in UTF-8 bytes
  std::unordered_map<std::string, int> ids_;
  std::vector<std::string> pieces_;  // by id
  int unk_ = 0;
};

// Calls fn on the lines of every document, cut to at most 4096 bytes at character boundaries: the trainer
// drops longer sentences, and a corpus of single-line documents would otherwise give it nothing.
template <typename Fn>
void for_each_line(Documents& docs, Fn&& fn) {
  constexpr size_t kMaxBytes = 4096;
  for (std::string doc; docs.next(doc);) {
    for (size_t pos = 0; pos < doc.size();) {
      size_t nl = doc.find('\n', pos);
      size_t end = std::min(nl == std::string::npos ? doc.size() : nl, pos + kMaxBytes);
      while (end < doc.size() && end > pos && (static_cast<unsigned char>(doc[end]) & 0xC0) == 0x80) end--;
      if (end == pos && end != nl) end = std::min(doc.size(), pos + kMaxBytes);  // malformed UTF-8
      if (end > pos) fn(doc.substr(pos, end - pos));
      pos = end + (end == nl ? 1 : 0);
    }
  }
}

// Ids that are no character or merge: the 256 byte pieces, <unk>, <s> and </s>.
constexpr int kReservedPieces = 259;

class SampleIterator : public sentencepiece::SentenceIterator {
 public:
  explicit SampleIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }
  void Next() override { i_++; }

 private:
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};

// The coverage at which the trainer keeps at most `max_chars` characters as pieces: the share of all
// characters held by the max_chars-1 most frequent ones (the trainer adds characters while below coverage).
double coverage_for(const std::vector<std::string>& lines, size_t max_chars) {
  std::unordered_map<uint32_t, uint64_t> counts;
  uint64_t total = 0;
  for (const std::string& l : lines)
    for (size_t i = 0; i < l.size(); total++) counts[next_codepoint(l, i)]++;
  std::vector<uint64_t> freq;
  for (const auto& kv : counts) freq.push_back(kv.second);
  std::sort(freq.begin(), freq.end(), std::greater<uint64_t>());
  uint64_t acc = 0;
  for (size_t i = 0; i + 1 < max_chars && i < freq.size(); i++) acc += freq[i];
  return total ? static_cast<double>(acc) / static_cast<double>(total) : 1.0;
}

// SentencePiece's failures name its own options (--character_coverage) and internal checks; this says what is
// wrong in prep's terms.
std::string training_failure(const std::string& what, const SentencePieceTraining& opt, double coverage) {
  const char* kTooManyChars = "Vocabulary size is smaller than required_chars.";
  int vocab = 0, needed = 0;
  const size_t at = what.find(kTooManyChars);
  if (at != std::string::npos &&
      std::sscanf(what.c_str() + at + std::strlen(kTooManyChars), " %d vs %d", &vocab, &needed) == 2)
    return strf("prep: --vocab-size %d is too small for %s: the characters that make up %.4g%% of its text are %d "
                "distinct ones, each a piece beside the %d byte and special pieces, so it needs --vocab-size %d or "
                "more%s",
                opt.vocab_size, opt.input.c_str(), 100 * coverage, needed - kReservedPieces, kReservedPieces, needed,
                opt.character_coverage > 0 ? strf(" (or a lower --character-coverage, %g at least)",
                                                  kMinCharacterCoverage).c_str() : "");
  return strf("prep: cannot train a %d-piece tokenizer on %s: SentencePiece says: %s", opt.vocab_size,
              opt.input.c_str(), what.c_str());
}

}  // namespace

void Tokenizer::check_id(uint32_t id) const {
  YUAN_CHECK(id < static_cast<uint32_t>(vocab_size_), "%s: token id %u outside the vocabulary [0, %d)", name_.c_str(),
             id, vocab_size_);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::ifstream probe(path);
  YUAN_CHECK(probe, "%s: cannot open tokenizer: %s", path.c_str(), std::strerror(errno));
  if (path.size() >= 6 && path.compare(path.size() - 6, 6, ".model") == 0)
    return std::make_unique<SentencePieceTokenizer>(path);
  if (is_bpe_path(path)) return load_bpe(path);
  return std::make_unique<WordPieceTokenizer>(path);
}

StoredTokenizer stored_tokenizer(const std::string& path) {
  if (is_bpe_path(path)) return {".json", bpe_tokenizer_json(path)};
  return {std::filesystem::path(path).extension().string(), read_text(path)};
}

void train_sentencepiece(Documents& docs, const SentencePieceTraining& opt, const std::string& model_path) {
  // A seeded reservoir sample of the lines bounds time and memory and makes the model a function of the input
  // and the seed alone.
  std::vector<std::string> sample;
  Rng rng(opt.seed, 0x7e4a);
  uint64_t seen = 0;
  for_each_line(docs, [&](std::string line) {
    if (sample.size() < opt.sentences) {
      sample.push_back(std::move(line));
    } else {
      uint64_t j = rng.next_u64() % (seen + 1);
      if (j < opt.sentences) sample[j] = std::move(line);
    }
    seen++;
  });
  YUAN_CHECK(!sample.empty(), "prep: %s: no text to train the tokenizer on", opt.input.c_str());
  // With byte fallback a character left out costs a few byte tokens, never an <unk>. Left to itself the
  // trainer would make every character of a CJK corpus a piece and run out of vocabulary, so by default the
  // characters may take at most 3/4 of the ids left after the byte and special pieces. SentencePiece refuses a
  // coverage below 98%: a text whose characters are too many for that fails below, naming --vocab-size.
  const double coverage =
      opt.character_coverage > 0
          ? opt.character_coverage
          : std::clamp(coverage_for(sample, static_cast<size_t>(opt.vocab_size - kReservedPieces) * 3 / 4),
                       kMinCharacterCoverage, 0.9995);
  say("prep: training a %d-piece tokenizer on %zu of %llu lines (character coverage %.6g)", opt.vocab_size,
      sample.size(), static_cast<unsigned long long>(seen), coverage);
  // Identity normalisation and kept whitespace make decoding give back the text exactly.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", strf("%.9g", coverage)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"hard_vocab_limit", "false"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},  // the BPE trainer's threads make the model depend on their timing
      {"minloglevel", "2"},
  };
  SampleIterator it(sample);
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!st.ok()) throw Error(training_failure(st.ToString(), opt, coverage));
  const std::string tmp = model_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    YUAN_CHECK(out.flush(), "%s: cannot write: %s", tmp.c_str(), std::strerror(errno));
  }
  YUAN_CHECK(std::rename(tmp.c_str(), model_path.c_str()) == 0, "%s: cannot rename to %s: %s", tmp.c_str(),
             model_path.c_str(), std::strerror(errno));
}

}  // namespace yuan
