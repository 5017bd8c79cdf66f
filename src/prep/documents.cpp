#include "prep/documents.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/fs.h"

namespace yuan {

InputFormat parse_input_format(const std::string& s) {
  for (InputFormat f : {InputFormat::Auto, InputFormat::Text, InputFormat::Jsonl, InputFormat::Fortune})
    if (s == input_format_name(f)) return f;
  throw Error(strf("--format: unknown format '%s' (auto, text, jsonl or fortune)", s.c_str()));
}

const char* input_format_name(InputFormat f) {
  switch (f) {
    case InputFormat::Auto: return "auto";
    case InputFormat::Text: return "text";
    case InputFormat::Jsonl: return "jsonl";
    case InputFormat::Fortune: return "fortune";
  }
  return "?";
}

InputFormat resolve_input_format(const std::string& path, InputFormat f) {
  if (f != InputFormat::Auto) return f;
  auto ends = [&](const char* ext) {
    size_t n = std::char_traits<char>::length(ext);
    return path.size() >= n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends(".jsonl") || ends(".json") || ends(".ndjson")) return InputFormat::Jsonl;
  if (ends(".txt")) return InputFormat::Text;
  std::ifstream in(path);
  YUAN_CHECK(in, "%s: cannot open input: %s", path.c_str(), std::strerror(errno));
  std::string line;
  bool first = true;
  for (size_t bytes = 0; bytes < (1 << 16) && std::getline(in, line); bytes += line.size() + 1) {
    if (line == "%") return InputFormat::Fortune;
    if (first && line.find_first_not_of(" \t\r") != std::string::npos) {
      if (line[line.find_first_not_of(" \t\r")] == '{') return InputFormat::Jsonl;
      first = false;
    }
  }
  return InputFormat::Text;
}

std::vector<InputFile> expand_inputs(const std::vector<std::string>& args, InputFormat format) {
  std::vector<InputFile> out;
  for (const std::string& a : args) {
    const std::vector<std::string> paths = expand_glob(a);
    YUAN_CHECK(!paths.empty(), "%s: no input file matches", a.c_str());
    for (const std::string& p : paths) {
      YUAN_CHECK(!std::filesystem::is_directory(p),
                 "%s: a directory, not an input file (give its files, e.g. %s/*.txt)", p.c_str(), p.c_str());
      out.push_back({p, resolve_input_format(p, format)});
    }
  }
  return out;
}

Documents::Documents(const std::vector<InputFile>& files, bool blank_separated)
    : files_(files), blank_separated_(blank_separated) {}

bool Documents::next(std::string& doc) {
  for (; file_ < files_.size(); file_++, open_ = false) {
    if (!open_) {
      in_ = std::ifstream(files_[file_].path, std::ios::binary);
      YUAN_CHECK(in_, "%s: cannot open input: %s", files_[file_].path.c_str(), std::strerror(errno));
      open_ = true;
      line_no_ = 0;
      offset_ = 0;
    }
    // Whitespace alone is no document: it would only add an end-of-text and a few space tokens, and input of
    // nothing else would replace a corpus with such "documents".
    while (next_in_file(doc))
      if (doc.find_first_not_of(" \t\n\v\f\r") != std::string::npos) return true;
    YUAN_CHECK(!in_.bad(), "%s: read error: %s", files_[file_].path.c_str(), std::strerror(errno));
  }
  return false;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c >= 0x01 && c < 0x80) {
      i++;
      continue;
    }
    // The sequence's length and the range of its second byte, which is what excludes overlong forms (E0, F0),
    // surrogates (ED) and code points above U+10FFFF (F4).
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      lo = c == 0xE0 ? 0xA0 : 0x80;
      hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      lo = c == 0xF0 ? 0x90 : 0x80;
      hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
      return i;  // NUL, a continuation byte without a lead, C0/C1 (overlong), F5..FF
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; k++)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// ESC '[' parameters final-byte: the colour codes fortune files wrap titles in.
void strip_ansi(std::string& s) {
  size_t o = 0;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\x1b' && i + 1 < s.size() && s[i + 1] == '[') {
      i += 2;
      while (i < s.size() && !(s[i] >= 0x40 && s[i] <= 0x7e)) i++;
      continue;
    }
    s[o++] = s[i];
  }
  s.resize(o);
}

void trim_blank_lines(std::string& s) {
  size_t b = s.find_first_not_of("\r\n"), e = s.find_last_not_of(" \t\r\n");
  s = b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

bool Documents::next_in_file(std::string& doc) {
  const InputFile& f = files_[file_];
  std::string line;
  doc.clear();
  while (std::getline(in_, line)) {
    line_no_++;
    const uint64_t at = offset_;
    offset_ += line.size() + 1;
    if (const size_t bad = find_invalid_utf8(line); bad != std::string_view::npos) {
      const auto off = static_cast<unsigned long long>(at + bad);
      if (line[bad] == '\0')
        throw Error(strf("%s: not UTF-8 text: a NUL byte at byte offset %llu (line %zu); is it a binary file?",
                         f.path.c_str(), off, line_no_));
      throw Error(strf("%s: not UTF-8 text: an invalid sequence at byte offset %llu (line %zu), starting 0x%02X",
                       f.path.c_str(), off, line_no_, static_cast<unsigned char>(line[bad])));
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    switch (f.format) {
      case InputFormat::Jsonl: {
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        nlohmann::json obj;
        try {
          obj = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          throw Error(strf("%s:%zu: bad JSON: %s", f.path.c_str(), line_no_, e.what()));
        }
        const auto text = obj.find("text");  // end() for a line that is not an object
        YUAN_CHECK(text != obj.end(), "%s:%zu: no \"text\" field", f.path.c_str(), line_no_);
        YUAN_CHECK(text->is_string(), "%s:%zu: \"text\" is not a string", f.path.c_str(), line_no_);
        doc = text->get<std::string>();
        if (doc.empty()) continue;
        return true;
      }
      case InputFormat::Fortune:
        if (line != "%") {
          doc += line;
          doc += '\n';
          continue;
        }
        strip_ansi(doc);
        trim_blank_lines(doc);
        if (!doc.empty()) return true;
        continue;
      default:
        if (!blank_separated_) {
          if (line.empty()) continue;
          doc = line;
          return true;
        }
        if (!line.empty()) {
          doc += line;
          doc += '\n';
          continue;
        }
        trim_blank_lines(doc);
        if (!doc.empty()) return true;
        continue;
    }
  }
  // The last document of a file needs no separator after it.
  if (f.format == InputFormat::Fortune) strip_ansi(doc);
  trim_blank_lines(doc);
  return !doc.empty();
}

}  // namespace yuan
