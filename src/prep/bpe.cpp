#include "prep/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "prep/documents.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/sha256.h"

namespace yuan {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// GPT-2's pre-tokenizer pattern, which a ByteLevel pre-tokenizer with use_regex applies.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEndOfText = "<|endoftext|>";

// GPT-2's byte-to-unicode table: the printable bytes of Latin-1 stand for themselves, the other 68 for U+0100
// onwards in byte order, so that every byte is a visible character in vocab.json and merges.txt.
std::vector<std::string> byte_chars() {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  std::vector<std::string> chars(256);
  int next = 256;
  for (int b = 0; b < 256; b++) {
    const int cp = printable(b) ? b : next++;
    chars[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                         : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return chars;
}

// The partner of one half of a GPT-2 pair: "gpt2-vocab.json" <-> "gpt2-merges.txt", OpenAI's "encoder.json" <->
// "vocab.bpe"; "" when `name` is neither.
std::string pair_partner(const std::string& name) {
  static const std::pair<const char*, const char*> kPairs[] = {{"vocab.json", "merges.txt"},
                                                              {"encoder.json", "vocab.bpe"}};
  for (const auto& [vocab, merges] : kPairs) {
    for (const auto& [from, to] : {std::pair{vocab, merges}, std::pair{merges, vocab}}) {
      const size_t n = std::strlen(from);
      if (name.size() >= n && name.compare(name.size() - n, n, from) == 0)
        return name.substr(0, name.size() - n) + to;
    }
  }
  return "";
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    throw Error(strf("%s: not JSON: %s", path.c_str(), e.what()));
  }
}

// The tokenizer.json of GPT-2's own tokenizer for a vocab.json + merges.txt pair: ByteLevel pre-tokenizer and
// decoder, <|endoftext|> a special token when the vocabulary has it (as HF's GPT2Tokenizer treats it).
std::string pair_to_tokenizer_json(const std::string& vocab_path, const json& vocab, const std::string& merges_path) {
  YUAN_CHECK(vocab.is_object() && !vocab.empty(), "%s: expected GPT-2's vocab.json, an object of token: id",
             vocab_path.c_str());
  std::vector<std::pair<uint64_t, std::string>> by_id;
  for (const auto& [token, id] : vocab.items()) {
    YUAN_CHECK(id.is_number_unsigned(), "%s: \"%s\": expected a non-negative integer id", vocab_path.c_str(),
               token.c_str());
    by_id.emplace_back(id.get<uint64_t>(), token);
  }
  std::sort(by_id.begin(), by_id.end());
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  for (const auto& [id, token] : by_id) v[token] = id;

  std::ifstream in(merges_path);
  YUAN_CHECK(in, "%s: cannot open: %s", merges_path.c_str(), std::strerror(errno));
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  std::string line;
  for (size_t no = 1; std::getline(in, line); no++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;  // the header GPT-2's files start with
    const size_t sp = line.find(' ');
    YUAN_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               "%s:%zu: expected a merge \"LEFT RIGHT\", found \"%s\"", merges_path.c_str(), no, line.c_str());
    merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  if (vocab.contains(kEndOfText))
    added.push_back({{"id", vocab[kEndOfText]}, {"content", kEndOfText}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const nlohmann::ordered_json t = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", v}, {"merges", merges}}}};
  return t.dump() + "\n";
}

// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD, as Rust's String::from_utf8_lossy (and so
// HF's decode) does: a model's ids may stop or start inside a character.
std::string lossy_utf8(std::string_view rest) {
  std::string out;
  for (;;) {
    const size_t bad = find_invalid_utf8(rest);
    if (bad == std::string_view::npos) return out.append(rest);
    out.append(rest.substr(0, bad + (rest[bad] == '\0')));  // find_invalid_utf8 stops at NUL too: it is valid
    if (rest[bad] == '\0') {
      rest.remove_prefix(bad + 1);
      continue;
    }
    // The subsequence is the lead byte and the continuation bytes that fit it, cut short; else the byte alone.
    const unsigned c = static_cast<unsigned char>(rest[bad]);
    const size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    const unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    size_t len = 1;
    for (; len < need && bad + len < rest.size(); len++) {
      const unsigned b = static_cast<unsigned char>(rest[bad + len]);
      if (len == 1 ? b < lo || b > hi : (b & 0xC0) != 0x80) break;
    }
    out += "\xEF\xBF\xBD";
    rest.remove_prefix(bad + len);
  }
}

// A compiled pattern; matching state is per thread (below), so one Regex serves every encoding thread.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &at, nullptr);
    YUAN_CHECK(code_, "%s: cannot compile pattern at offset %zu: %s", where.c_str(), static_cast<size_t>(at),
               message(err).c_str());
    // Without JIT support (some architectures) pcre2_match interprets the pattern: slower, the same matches.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s[from, n) as [begin, end); false when none. `s` is valid UTF-8 (checked by encode).
  bool find(const char* s, size_t n, size_t from, size_t& begin, size_t& end) const {
    MatchState& m = state();
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s), n, from, PCRE2_NO_UTF_CHECK, m.data, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    YUAN_CHECK(rc >= 0, "bpe: pre-tokenizer pattern failed on a %zu-byte text: %s", n, message(rc).c_str());
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    begin = ov[0], end = ov[1];
    return true;
  }

 private:
  // One match block and JIT stack per thread. A pattern that repeats a group with alternatives, as
  // `(?:\p{L}|\p{N})+`, overflows the default 32 KiB JIT stack on a long word (PCRE2_ERROR_JIT_STACKLIMIT); this
  // one grows to 64 MiB as needed. One ovector pair suffices: only the whole match is read (pcre2_match returns 0,
  // not an error, when captures do not fit).
  struct MatchState {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    MatchState() {
      YUAN_CHECK(data && stack && context, "bpe: out of memory for the pre-tokenizer's matching state");
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~MatchState() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
      pcre2_match_data_free(data);
    }
  };
  static MatchState& state() {
    thread_local MatchState m;
    return m;
  }
  static std::string message(int err) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
  }
  pcre2_code* code_ = nullptr;
};

class BpeTokenizer : public Tokenizer {
 public:
  BpeTokenizer(const std::string& path, const std::string& text) : file_(path) {
    try {
      read(json::parse(text));
    } catch (const json::exception& e) {  // what the checks below do not foresee: a value of another JSON type
      throw Error(strf("%s: not a tokenizer.json yuanlm reads: %s", path.c_str(), e.what()));
    }
    decoded_.assign(vocab_size_, "");
    std::unordered_map<std::string, unsigned char> char_byte;
    for (int b = 0; b < 256; b++) char_byte[kByteChars[b]] = static_cast<unsigned char>(b);
    for (const auto& [token, id] : ids_) decoded_[id] = decode_token(token, char_byte);
    for (const Added& a : added_) decoded_[a.id] = decode_token(a.content, char_byte);
    auto eot = std::find_if(added_.begin(), added_.end(), [](const Added& a) { return a.content == kEndOfText; });
    auto eot_vocab = ids_.find(kEndOfText);
    eot_id_ = eot != added_.end() ? eot->id : eot_vocab != ids_.end() ? eot_vocab->second : vocab_size_++;
    name_ = "bpe:sha256:" + sha256_hex(text);
  }

  void encode(const std::string& text, std::vector<uint32_t>& out) const override {
    check_utf8(text);
    // Added tokens not normalized are split out first, then the normalized ones (HF's order; with no normalizer
    // both match the raw text), and the text between them is pre-tokenized.
    split_added(text, 0, text.size(), 0, out);
  }

  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string bytes;
    for (uint32_t id : ids) {
      check_id(id);
      if (static_cast<int>(id) != eot_id_) bytes += decoded_[id];
    }
    return lossy_utf8(bytes);
  }

 private:
  struct Added {
    std::string content;
    uint32_t id;
    bool normalized;
  };
  struct Merge {
    uint32_t rank, id;
  };

  // `key` is the value's jq path (".model.type"); `found` is cut to 80 characters (it may be a whole vocabulary).
  [[noreturn]] void refuse(const std::string& key, const std::string& expected, const std::string& found) const {
    throw Error(strf("%s: %s: expected %s, found %s (not a byte-level BPE tokenizer yuanlm reads)", file_.c_str(),
                     key.c_str(), expected.c_str(),
                     found.size() > 80 ? (found.substr(0, 77) + "...").c_str() : found.c_str()));
  }
  [[noreturn]] void refuse(const std::string& key, const std::string& expected, const json& found) const {
    refuse(key, expected, found.is_null() ? std::string("none") : found.dump());
  }

  // The member `key` of `o`; null when `o` is no object or lacks it.
  static const json& member(const json& o, const char* key) {
    static const json null;
    if (!o.is_object()) return null;
    auto it = o.find(key);
    return it != o.end() ? *it : null;
  }
  // A flag that must be absent, null or false: a tokenizer that turns it on is refused, naming it (README, prep).
  void require_off(const json& o, const char* flag, const std::string& at) const {
    const json& v = member(o, flag);
    if (!v.is_null() && v != false) refuse(at + "." + flag, "false", v);
  }

  void read(const json& t) {
    if (!t.is_object() || !t.contains("model"))
      refuse(".model", "a HuggingFace tokenizer.json with a \"model\"", json());
    for (const char* key : {"truncation", "padding", "normalizer"})
      if (!member(t, key).is_null()) refuse(std::string(".") + key, "null (yuanlm implements none)", member(t, key));
    read_model(member(t, "model"));
    read_pre_tokenizer(member(t, "pre_tokenizer"));
    const json& dec = member(t, "decoder");
    if (member(dec, "type") != "ByteLevel") refuse(".decoder.type", "ByteLevel", member(dec, "type"));
    const json& post = member(t, "post_processor");
    if (!post.is_null() && member(post, "type") != "ByteLevel")
      refuse(".post_processor.type", "ByteLevel or null (yuanlm adds only the eot before each document)",
             member(post, "type"));
    const json& added = member(t, "added_tokens");
    if (!added.is_null()) read_added_tokens(added);
  }

  void read_model(const json& m) {
    // Files from tokenizers before 0.9 (GPT-2's own on the HF hub) have no type: HF takes a model with merges for
    // BPE.
    const bool untyped_bpe = !m.contains("type") && m.contains("merges");
    if (!untyped_bpe && member(m, "type") != "BPE") refuse(".model.type", "BPE", member(m, "type"));
    if (!member(m, "dropout").is_null()) refuse(".model.dropout", "null", member(m, "dropout"));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = member(m, key);
      if (!v.is_null() && v != "") refuse(std::string(".model.") + key, "null or \"\"", v);
    }
    ignore_merges_ = member(m, "ignore_merges") == true;
    const json& vocab = member(m, "vocab");
    if (!vocab.is_object() || vocab.empty()) refuse(".model.vocab", "an object of token: id", vocab);
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= (1u << 31))
        refuse(".model.vocab[\"" + token + "\"]", "an id in [0, 2^31)", id);
      ids_[token] = id.get<uint32_t>();
      vocab_size_ = std::max<int>(vocab_size_, id.get<int>() + 1);
    }
    // Every byte must be a token: byte-level BPE never needs an unknown token.
    for (int b = 0; b < 256; b++) {
      auto it = ids_.find(kByteChars[b]);
      if (it == ids_.end())
        refuse(".model.vocab", "a token for every byte",
               strf("none for byte 0x%02X (\"%s\")", b, kByteChars[b].c_str()));
      byte_id_[b] = it->second;
    }
    const json& merges = member(m, "merges");
    if (!merges.is_array()) refuse(".model.merges", "an array", merges);
    for (size_t r = 0; r < merges.size(); r++) {
      const json& e = merges[r];
      std::string left, right;
      if (e.is_string()) {  // "LEFT RIGHT", the format before tokenizers 0.20
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp != std::string::npos) left = s.substr(0, sp), right = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        left = e[0].get<std::string>(), right = e[1].get<std::string>();
      }
      if (left.empty() || right.empty())
        refuse(strf(".model.merges[%zu]", r), "\"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]", e);
      auto l = ids_.find(left), rt = ids_.find(right), joined = ids_.find(left + right);
      if (l == ids_.end() || rt == ids_.end() || joined == ids_.end())
        refuse(strf(".model.merges[%zu]", r), "tokens of the vocabulary",
               e.dump() + " (" + (l == ids_.end() ? left : rt == ids_.end() ? right : left + right) + " is not)");
      // A later duplicate replaces an earlier one, as in HF's map.
      merges_[pair_key(l->second, rt->second)] = Merge{static_cast<uint32_t>(r), joined->second};
    }
  }

  void read_pre_tokenizer(const json& p) {
    const bool sequence = member(p, "type") == "Sequence";
    const json& steps = sequence ? member(p, "pretokenizers") : p;
    if (sequence ? !steps.is_array() || steps.empty() : !p.is_object())
      refuse(".pre_tokenizer", "ByteLevel, or a Sequence of Splits then ByteLevel", p);
    const size_t n = sequence ? steps.size() : 1;
    for (size_t i = 0; i < n; i++) {
      const json& s = sequence ? steps[i] : p;
      const std::string key = sequence ? strf(".pre_tokenizer.pretokenizers[%zu]", i) : ".pre_tokenizer";
      const json& type = member(s, "type");
      const bool last = i + 1 == n;
      if (type == "ByteLevel" && last) {
        require_off(s, "add_prefix_space", key);
        if (member(s, "use_regex") != false) splits_.push_back(std::make_unique<Regex>(kGpt2Pattern, false, key));
        return;
      }
      if (type != "Split") refuse(key + ".type", last ? "ByteLevel last" : "Split (before the ByteLevel)", type);
      if (member(s, "behavior") != "Isolated") refuse(key + ".behavior", "\"Isolated\"", member(s, "behavior"));
      require_off(s, "invert", key);
      const json& pat = member(s, "pattern");
      const bool regex = member(pat, "Regex").is_string(), literal = member(pat, "String").is_string();
      if (!regex && !literal) refuse(key + ".pattern", "{\"Regex\": ...} or {\"String\": ...}", pat);
      splits_.push_back(std::make_unique<Regex>(member(pat, regex ? "Regex" : "String").get<std::string>(), literal,
                                                file_ + ": " + key + ".pattern"));
    }
  }

  void read_added_tokens(const json& added) {
    if (!added.is_array()) refuse(".added_tokens", "an array", added);
    for (size_t i = 0; i < added.size(); i++) {
      const json& a = added[i];
      const std::string key = strf(".added_tokens[%zu]", i);
      const json &content = member(a, "content"), &id = member(a, "id");
      if (!content.is_string() || content == "" || !id.is_number_unsigned() || id.get<uint64_t>() >= (1u << 31))
        refuse(key, "{\"id\": N, \"content\": \"...\"}", a);
      // HF strips spaces around such tokens or matches them as whole words only; yuanlm does not.
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) require_off(a, flag, key);
      added_.push_back({content.get<std::string>(), id.get<uint32_t>(), member(a, "normalized") != false});
      vocab_size_ = std::max<int>(vocab_size_, id.get<int>() + 1);
    }
    // Leftmost-longest matching, as HF's: at one position the longest token wins.
    std::stable_sort(added_.begin(), added_.end(),
                     [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
    for (const Added& a : added_) in_group_[a.normalized] = true;
  }

  // The token's bytes: its characters through the byte table, or (an added token with other characters) its
  // own UTF-8, as HF's ByteLevel decoder does.
  static std::string decode_token(const std::string& token,
                                  const std::unordered_map<std::string, unsigned char>& char_byte) {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      size_t len = 1;
      while (i + len < token.size() && (static_cast<unsigned char>(token[i + len]) & 0xC0) == 0x80) len++;
      auto it = char_byte.find(token.substr(i, len));
      if (it == char_byte.end()) return token;
      bytes += static_cast<char>(it->second);
      i += len;
    }
    return bytes;
  }

  static uint64_t pair_key(uint32_t left, uint32_t right) { return (static_cast<uint64_t>(left) << 32) | right; }

  void check_utf8(const std::string& text) const {
    std::string_view rest(text);
    for (size_t base = 0;;) {
      const size_t bad = find_invalid_utf8(rest);
      if (bad == std::string_view::npos) return;
      // find_invalid_utf8 stops at NUL too, which is valid UTF-8 and which HF encodes.
      YUAN_CHECK(rest[bad] == '\0', "%s: cannot encode: the text is not UTF-8 (an invalid sequence at byte offset %zu)",
                 name_.c_str(), base + bad);
      rest.remove_prefix(bad + 1);
      base += bad + 1;
    }
  }

  // Splits text[begin, end) at the added tokens of `group` (0: not normalized, 1: normalized), leftmost-longest;
  // what lies between goes on to the next group, then to the pre-tokenizer.
  void split_added(const std::string& text, size_t begin, size_t end, int group, std::vector<uint32_t>& out) const {
    if (group == 2) {
      pre_tokenize(text.data() + begin, end - begin, 0, out);
      return;
    }
    if (!in_group_[group]) {
      split_added(text, begin, end, group + 1, out);
      return;
    }
    constexpr size_t npos = std::string_view::npos;
    const std::string_view span(text.data(), end);
    // Where each token of the group next occurs: searched again only once a hit has passed it, so a text full of
    // one token is not searched again for the others each time.
    std::vector<size_t> next(added_.size(), npos);
    for (size_t i = 0; i < added_.size(); i++)
      if (added_[i].normalized == (group == 1)) next[i] = span.find(added_[i].content, begin);
    size_t pos = begin;
    for (;;) {
      size_t best = npos, hit = 0;
      for (size_t i = 0; i < added_.size(); i++) {
        if (next[i] != npos && next[i] < pos) next[i] = span.find(added_[i].content, pos);
        if (next[i] < best) best = next[i], hit = i;  // longest first: at one position the longest token wins
      }
      if (best == npos) break;
      if (best > pos) split_added(text, pos, best, group + 1, out);
      out.push_back(added_[hit].id);
      pos = best + added_[hit].content.size();
    }
    if (pos < end) split_added(text, pos, end, group + 1, out);
  }

  // Cuts s[0, n) into the pieces of split `level` (a match and the text between matches are each a piece; an empty
  // match cuts there, as in HF), each cut by the next level; the pieces of the last level go to the BPE model.
  void pre_tokenize(const char* s, size_t n, size_t level, std::vector<uint32_t>& out) const {
    if (level == splits_.size()) {
      if (n > 0) bpe(s, n, out);
      return;
    }
    size_t pos = 0, b = 0, e = 0;
    for (size_t from = 0; from < n && splits_[level]->find(s, n, from, b, e);) {
      if (e == b) {  // a cut at b, then the search goes on one character further
        if (b > pos) pre_tokenize(s + pos, b - pos, level + 1, out);
        pos = b;
        from = b + 1;
        while (from < n && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) from++;
        continue;
      }
      if (b > pos) pre_tokenize(s + pos, b - pos, level + 1, out);
      pre_tokenize(s + b, e - b, level + 1, out);
      pos = from = e;
    }
    if (pos < n) pre_tokenize(s + pos, n - pos, level + 1, out);
  }

  // The ids of one pre-tokenized piece: its bytes as byte tokens, then always the adjacent pair of lowest merge
  // rank merged (leftmost first among equals), as HF's BPE does. Pieces repeat, so each thread keeps the ids of
  // the short ones it has seen.
  void bpe(const char* s, size_t n, std::vector<uint32_t>& out) const {
    struct Cache {
      uint64_t owner = 0;
      std::unordered_map<std::string, std::vector<uint32_t>> ids;
    };
    thread_local Cache cache;
    if (cache.owner != instance_) cache.owner = instance_, cache.ids.clear();
    const bool cacheable = n <= kMaxCachedBytes;
    std::string piece;
    if (cacheable) {
      piece.assign(s, n);
      auto hit = cache.ids.find(piece);
      if (hit != cache.ids.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
      }
    }
    const size_t mark = out.size();
    merge(s, n, out);
    if (cacheable) {
      if (cache.ids.size() >= kMaxCachedPieces) cache.ids.clear();
      cache.ids.emplace(std::move(piece), std::vector<uint32_t>(out.begin() + mark, out.end()));
    }
  }

  void merge(const char* s, size_t n, std::vector<uint32_t>& out) const {
    if (ignore_merges_) {  // a piece that is a token as a whole is that token
      std::string mapped;
      for (size_t i = 0; i < n; i++) mapped += kByteChars[static_cast<unsigned char>(s[i])];
      auto it = ids_.find(mapped);
      if (it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym {
      uint32_t id;
      int prev, next;  // -1 at either end; a merged-away symbol has id kGone
    };
    constexpr uint32_t kGone = ~0u;
    std::vector<Sym> sym(n);
    for (size_t i = 0; i < n; i++)
      sym[i] = {byte_id_[static_cast<unsigned char>(s[i])], static_cast<int>(i) - 1,
                i + 1 < n ? static_cast<int>(i) + 1 : -1};
    using Entry = std::pair<uint32_t, int>;  // (rank, position of the pair's left symbol)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](int left) {
      auto it = merges_.find(pair_key(sym[left].id, sym[sym[left].next].id));
      if (it != merges_.end()) heap.push({it->second.rank, left});
    };
    for (size_t i = 0; i + 1 < n; i++) push(static_cast<int>(i));
    while (!heap.empty()) {
      const auto [rank, left] = heap.top();
      heap.pop();
      // An entry goes stale when either symbol has merged since: the pair now there has another rank.
      if (sym[left].id == kGone || sym[left].next < 0) continue;
      const int right = sym[left].next;
      auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
      if (it == merges_.end() || it->second.rank != rank) continue;
      sym[left].id = it->second.id;
      sym[left].next = sym[right].next;
      if (sym[right].next >= 0) sym[sym[right].next].prev = left;
      sym[right].id = kGone;
      if (sym[left].prev >= 0) push(sym[left].prev);
      if (sym[left].next >= 0) push(left);
    }
    for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

  static constexpr size_t kMaxCachedBytes = 64, kMaxCachedPieces = 1 << 16;
  static inline std::atomic<uint64_t> instances_{0};
  static inline const std::vector<std::string> kByteChars = byte_chars();

  const std::string file_;
  const uint64_t instance_ = ++instances_;  // tells apart the per-thread caches of tokenizers at the same address
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  uint32_t byte_id_[256] = {};
  bool ignore_merges_ = false;
  std::vector<std::unique_ptr<Regex>> splits_;
  std::vector<Added> added_;          // longest first
  bool in_group_[2] = {false, false};  // whether any added token is [not normalized, normalized]
  std::vector<std::string> decoded_;   // the bytes of each id
};

}  // namespace

bool is_bpe_path(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return fs::path(path).extension() == ".json" || pair_partner(name) != "";
}

std::string bpe_tokenizer_json(const std::string& path) {
  const fs::path p(path);
  const std::string partner = pair_partner(p.filename().string());
  if (p.extension() == ".json") {
    const json j = parse_json(path);
    if (j.is_object() && j.contains("model")) return read_text(path);
    YUAN_CHECK(!partner.empty(), "%s: expected a HuggingFace tokenizer.json (with a \"model\") or GPT-2's vocab.json",
               path.c_str());
    const std::string merges = (p.parent_path() / partner).string();
    YUAN_CHECK(fs::exists(merges), "%s: GPT-2's vocab.json needs its merges beside it: %s is missing", path.c_str(),
               merges.c_str());
    return pair_to_tokenizer_json(path, j, merges);
  }
  const std::string vocab = (p.parent_path() / partner).string();
  YUAN_CHECK(fs::exists(vocab), "%s: GPT-2's merges need their vocabulary beside them: %s is missing", path.c_str(),
             vocab.c_str());
  return pair_to_tokenizer_json(vocab, parse_json(vocab), path);
}

std::unique_ptr<Tokenizer> load_bpe(const std::string& path) {
  return std::make_unique<BpeTokenizer>(path, bpe_tokenizer_json(path));
}

}  // namespace yuan
