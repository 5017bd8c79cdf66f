// The documents of `yuanlm prep`'s input files, streamed in order: plain text (a document per line, or
// blank-line separated), JSON Lines (the "text" field of each object) or fortune files ("%" lines between
// entries, ANSI colour codes stripped).
#pragma once
#include <fstream>
#include <string>
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

class Documents {
 public:
  Documents(const std::vector<InputFile>& files, bool blank_separated);
  // The next non-empty document of all files in order; false after the last.
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
};

}  // namespace yuan
