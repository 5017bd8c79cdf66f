#include "prep/token_import.h"

#include <cstring>
#include <filesystem>

#include "util/error.h"
#include "util/fs.h"
#include "util/mapped_file.h"

namespace yuan {

namespace {

struct TokenType {
  const char* name;
  unsigned width;  // bytes
  bool is_signed;
};

constexpr size_t kPiece = 1 << 20;  // tokens converted and handed on at a time

// Converts `n` tokens at `p` to ids, each checked inside the vocabulary; `index` is the first one's position among
// the file's tokens, for the message.
void convert(const MappedFile& f, const uint8_t* p, size_t n, TokenType t, uint64_t index, int vocab_size,
             std::vector<uint32_t>& out) {
  out.resize(n);
  for (size_t i = 0; i < n; i++, p += t.width) {
    int64_t id;
    if (t.is_signed) {
      switch (t.width) {
        case 1: id = static_cast<int8_t>(*p); break;
        case 2: id = load_unaligned<int16_t>(p); break;
        case 4: id = load_unaligned<int32_t>(p); break;
        default: id = load_unaligned<int64_t>(p);
      }
    } else {
      uint64_t v = 0;
      std::memcpy(&v, p, t.width);
      id = v > INT64_MAX ? -1 : static_cast<int64_t>(v);
    }
    YUAN_CHECK(id >= 0 && id < vocab_size, "%s: token id %lld at token %llu is outside the tokenizer's vocabulary "
               "(vocab_size %d)", f.path().c_str(), static_cast<long long>(id),
               static_cast<unsigned long long>(index + i), vocab_size);
    out[i] = static_cast<uint32_t>(id);
  }
}

// ---- Megatron-LM indexed dataset (megatron/core/datasets/indexed_dataset.py) ----
// PREFIX.idx: "MMIDIDX\0\0", uint64 version 1, uint8 dtype code, uint64 sequence count S, uint64 document count D,
// int32 sequence lengths [S], int64 sequence byte offsets in .bin [S], int64 document starts [D] (sequence
// indices: 0 first, S last, so D-1 documents). PREFIX.bin: the tokens.
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kMegatronHeader = 9 + 8 + 1 + 8 + 8;

struct MegatronIndex {
  explicit MegatronIndex(const std::string& prefix) : idx(prefix + ".idx", true) {
    const char* p = idx.path().c_str();
    YUAN_CHECK(idx.size() >= kMegatronHeader, "%s: truncated: %llu bytes, shorter than a Megatron index header (%llu)",
               p, static_cast<unsigned long long>(idx.size()), static_cast<unsigned long long>(kMegatronHeader));
    YUAN_CHECK(std::memcmp(idx.data(), kMegatronMagic, 9) == 0,
               "%s: not a Megatron index: bad magic (expected \"MMIDIDX\\0\\0\")", p);
    const uint64_t version = idx.at<uint64_t>(9);
    YUAN_CHECK(version == 1, "%s: unsupported Megatron index version %llu (expected 1)", p,
               static_cast<unsigned long long>(version));
    const uint8_t code = idx.at<uint8_t>(17);
    static const TokenType types[] = {{"", 0, false},        {"uint8", 1, false}, {"int8", 1, true},
                                      {"int16", 2, true},    {"int32", 4, true},  {"int64", 8, true},
                                      {"float64", 0, false}, {"float32", 0, false}, {"uint16", 2, false}};
    YUAN_CHECK(code >= 1 && code <= 8, "%s: unknown Megatron dtype code %d (expected 1 to 8)", p, code);
    type = types[code];
    YUAN_CHECK(type.width > 0, "%s: dtype %s: token ids must be integers (uint8, int8, int16, uint16, int32, int64)", p,
               type.name);
    seqs = idx.at<uint64_t>(18);
    docs = idx.at<uint64_t>(26);
    // Divided rather than multiplied: counts from a corrupt header must not overflow into a plausible size.
    const uint64_t body = idx.size() - kMegatronHeader;
    YUAN_CHECK(seqs <= body / 12 && docs <= (body - 12 * seqs) / 8,
               "%s: truncated: %llu bytes, the header promises %llu sequences and %llu document starts", p,
               static_cast<unsigned long long>(idx.size()), static_cast<unsigned long long>(seqs),
               static_cast<unsigned long long>(docs));
    // Megatron's multimodal datasets append an int8 mode per sequence.
    YUAN_CHECK(body != 13 * seqs + 8 * docs || seqs == 0,
               "%s: a multimodal index (a mode per sequence): only token datasets are imported", p);
    YUAN_CHECK(body == 12 * seqs + 8 * docs,
               "%s: sizes disagree: %llu bytes, expected %llu for %llu sequences and %llu document starts", p,
               static_cast<unsigned long long>(idx.size()),
               static_cast<unsigned long long>(kMegatronHeader + 12 * seqs + 8 * docs),
               static_cast<unsigned long long>(seqs), static_cast<unsigned long long>(docs));
    YUAN_CHECK(docs >= 1 && doc_start(0) == 0 && static_cast<uint64_t>(doc_start(docs - 1)) == seqs,
               "%s: bad document starts: expected the first to be 0 and the last the sequence count %llu", p,
               static_cast<unsigned long long>(seqs));
  }
  int32_t length(uint64_t s) const { return idx.at<int32_t>(kMegatronHeader + 4 * s); }
  int64_t pointer(uint64_t s) const { return idx.at<int64_t>(kMegatronHeader + 4 * seqs + 8 * s); }
  int64_t doc_start(uint64_t d) const { return idx.at<int64_t>(kMegatronHeader + 12 * seqs + 8 * d); }

  MappedFile idx;
  TokenType type;
  uint64_t seqs = 0, docs = 0;
};

void import_megatron(const std::string& prefix, TokenSource& src, int vocab_size, uint32_t eot_id,
                     const TokenSink& sink) {
  const MegatronIndex ix(prefix);
  const MappedFile bin(prefix + ".bin", true);
  const unsigned w = ix.type.width;
  std::vector<uint32_t> ids;
  for (uint64_t d = 0; d + 1 < ix.docs; d++) {
    const int64_t first = ix.doc_start(d), end = ix.doc_start(d + 1);
    YUAN_CHECK(first <= end && end <= static_cast<int64_t>(ix.seqs),
               "%s: document %llu: sequences %lld to %lld are out of order or past the %llu sequences",
               ix.idx.path().c_str(), static_cast<unsigned long long>(d), static_cast<long long>(first),
               static_cast<long long>(end), static_cast<unsigned long long>(ix.seqs));
    bool started = false;
    for (int64_t s = first; s < end; s++) {
      const int64_t len = ix.length(s), ptr = ix.pointer(s);
      YUAN_CHECK(len >= 0 && ptr >= 0 && static_cast<uint64_t>(ptr) <= bin.size() &&
                     static_cast<uint64_t>(len) * w <= bin.size() - ptr,
                 "%s: sequence %lld (%lld tokens at byte %lld) lies past the end of %s (%llu bytes): an index past "
                 "the data, or a truncated .bin",
                 ix.idx.path().c_str(), static_cast<long long>(s), static_cast<long long>(len),
                 static_cast<long long>(ptr), bin.path().c_str(), static_cast<unsigned long long>(bin.size()));
      // A document of no tokens is skipped, as text of whitespace alone is: it would be a lone eot_id.
      if (len > 0 && !started) {
        sink(&eot_id, 1, true);
        src.docs++;
        started = true;
      }
      for (int64_t at = 0; at < len; at += kPiece) {
        const size_t n = std::min<int64_t>(kPiece, len - at);
        convert(bin, bin.data() + ptr + at * w, n, ix.type, ptr / w + at, vocab_size, ids);
        sink(ids.data(), n, false);
      }
    }
  }
}

// ---- llm.c token files (dev/data/data_common.py) ----
// 256 int32: magic, version, token count, zeros; then the tokens: GPT-2's files are magic 20240520, version 1,
// uint16 tokens; Llama 3's magic 20240801, version 7, uint32 tokens.
constexpr uint64_t kLlmcHeader = 256 * 4;

TokenType llmc_type(const MappedFile& f) {
  const char* p = f.path().c_str();
  YUAN_CHECK(f.size() >= kLlmcHeader, "%s: truncated: %llu bytes, shorter than an llm.c header (1024)", p,
             static_cast<unsigned long long>(f.size()));
  const int32_t magic = f.at<int32_t>(0), version = f.at<int32_t>(4);
  TokenType t;
  if (magic == 20240520) {
    YUAN_CHECK(version == 1, "%s: unsupported llm.c version %d for magic 20240520 (expected 1: uint16 tokens)", p,
               version);
    t = {"uint16", 2, false};
  } else {
    YUAN_CHECK(magic == 20240801, "%s: not an llm.c token file: bad magic %d (expected 20240520 or 20240801)", p,
               magic);
    YUAN_CHECK(version == 7, "%s: unsupported llm.c version %d for magic 20240801 (expected 7: uint32 tokens)", p,
               version);
    t = {"uint32", 4, false};
  }
  const int32_t count = f.at<int32_t>(8);
  const uint64_t expected = kLlmcHeader + static_cast<uint64_t>(std::max(count, 0)) * t.width;
  YUAN_CHECK(count >= 0 && f.size() >= expected,
             "%s: truncated: %llu bytes, the header promises %d %s tokens (%llu bytes)", p, static_cast<unsigned long long>(f.size()), count, t.name, static_cast<unsigned long long>(expected));
  YUAN_CHECK(f.size() == expected, "%s: sizes disagree: %llu bytes, the header promises %d %s tokens (%llu bytes)", p,
             static_cast<unsigned long long>(f.size()), count, t.name, static_cast<unsigned long long>(expected));
  return t;
}

void import_llmc(TokenSource& src, int vocab_size, uint32_t eot_id, const TokenSink& sink) {
  const MappedFile f(src.path, true);
  const TokenType t = llmc_type(f);
  const uint64_t count = (f.size() - kLlmcHeader) / t.width;
  std::vector<uint32_t> ids;
  bool in_doc = false, start = false;  // start: the next piece begins with the eot_id that starts a document
  auto emit = [&](size_t a, size_t b) {
    if (a == b) return;
    if (!in_doc) {  // tokens before the file's first eot_id
      sink(&eot_id, 1, true);
      src.docs++;
      in_doc = true;
    }
    sink(ids.data() + a, b - a, start);
    src.docs += start;
    start = false;
  };
  for (uint64_t at = 0; at < count; at += kPiece) {
    const size_t n = std::min<uint64_t>(kPiece, count - at);
    convert(f, f.data() + kLlmcHeader + at * t.width, n, t, at, vocab_size, ids);
    size_t a = 0;
    for (size_t i = 0; i < n; i++)
      if (ids[i] == eot_id) {
        emit(a, i);
        a = i;
        start = in_doc = true;
      }
    emit(a, n);
  }
}

}  // namespace

std::vector<TokenSource> token_sources(TokenFormat format, const std::vector<std::string>& inputs) {
  std::vector<TokenSource> out;
  for (const std::string& in : inputs) {
    if (format == TokenFormat::Megatron) {
      for (const char* ext : {".idx", ".bin"})
        YUAN_CHECK(std::filesystem::is_regular_file(in + ext), "%s%s: missing: --format megatron takes a PREFIX "
                   "with PREFIX.idx and PREFIX.bin", in.c_str(), ext);
      MegatronIndex{in};
      out.push_back({in + ".bin", static_cast<uint64_t>(std::filesystem::file_size(in + ".bin"))});
    } else {
      const std::vector<std::string> paths = expand_glob(in);
      YUAN_CHECK(!paths.empty(), "%s: no input file matches", in.c_str());
      for (const std::string& p : paths) {
        llmc_type(MappedFile(p));
        out.push_back({p, static_cast<uint64_t>(std::filesystem::file_size(p))});
      }
    }
  }
  return out;
}

void import_tokens(TokenFormat format, std::vector<TokenSource>& sources, int vocab_size, uint32_t eot_id,
                   const TokenSink& sink) {
  for (TokenSource& s : sources) {
    s.docs = 0;
    if (format == TokenFormat::Megatron)
      import_megatron(s.path.substr(0, s.path.size() - 4), s, vocab_size, eot_id, sink);
    else
      import_llmc(s, vocab_size, eot_id, sink);
  }
}

}  // namespace yuan
