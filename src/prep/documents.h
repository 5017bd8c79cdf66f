// The documents of `yuanlm prep`'s input files, streamed in order: plain text (a document per line, or
// blank-line separated), JSON Lines (the "text" field of each object) or fortune files ("%" lines between
// entries, ANSI colour codes stripped).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace yuan {

enum class InputFormat { Auto, Text, Jsonl, Fortune };
InputFormat parse_input_format(const std::string& s);  // "auto" | "text" | "jsonl" | "fortune"
const char* input_format_name(InputFormat f);
// Auto: by extension (.jsonl/.json/.ndjson, .txt), else by content (a "%" line: fortune; "{" first: jsonl).
InputFormat resolve_input_format(const std::string& path, InputFormat f);

struct InputFile {
  std::string path;
  InputFormat format;
};
// Expands each argument with glob(3) (sorted within a glob; arguments kept in order) and resolves formats.
// An argument that matches nothing is an error naming it.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& args, InputFormat format);

// The offset of the first byte of the first sequence in `s` that is not well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF, no sequence cut short), or of the first NUL byte, which no text
// file holds; npos when there is none.
size_t find_invalid_utf8(std::string_view s);

// Refuses input that is not UTF-8 text (a binary file, another encoding) with an error naming the file and the
// byte offset, as it reads: no second pass over the corpus.
class Documents {
 public:
  Documents(const std::vector<InputFile>& files, bool blank_separated);
  // The next document of all files in order that holds more than whitespace; false after the last.
  bool next(std::string& doc);
  size_t file_index() const { return file_; }  // the file the last document came from

 private:
  bool next_in_file(std::string& doc);
  std::vector<InputFile> files_;
  bool blank_separated_;
  size_t file_ = 0;
  bool open_ = false;
  std::ifstream in_;
  size_t line_no_ = 0;
  uint64_t offset_ = 0;  // of the next line in the file
};

}  // namespace yuan
