#pragma once
#include <string>
#include <vector>

namespace yuan {
// Writes `path.tmp`, fsyncs, renames over `path`, fsyncs the directory: readers see the old or the new file,
// never half of one. Throws Error naming the file.
void write_file_atomic(const std::string& path, const std::string& content);
void make_dirs(const std::string& dir);  // mkdir -p; throws naming the directory
void sync_dir(const std::string& dir);   // fsync a directory, so renames in it are durable
// The paths matching a glob(3) pattern, sorted (so every rank sees the same order); empty when none match.
// Throws naming the pattern when glob itself fails.
std::vector<std::string> expand_glob(const std::string& pattern);
}  // namespace yuan
