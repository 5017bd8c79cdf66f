#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace yuan {
// Writes `path.tmp`, fsyncs, renames over `path`, fsyncs the directory: readers see the old or the new file,
// never half of one. Throws Error naming the file.
void write_file_atomic(const std::string& path, const std::string& content);
// The whole of a file; throws Error naming it when it cannot be read.
std::string read_text(const std::string& path);
// The bytes of a file, piece after piece (8 MiB at a time), to `use`, for a checksum that need not hold the file;
// throws Error naming it when it cannot be opened or read.
void read_file_chunks(const std::string& path, const std::function<void(const char*, size_t)>& use);
void make_dirs(const std::string& dir);  // mkdir -p; throws naming the directory
void sync_dir(const std::string& dir);   // fsync a directory, so renames in it are durable
void sync_file(const std::string& path); // fsync a file's data, before it is renamed into place; throws naming it
// The paths matching a glob(3) pattern, sorted (so every rank sees the same order); empty when none match.
// Throws naming the pattern when glob itself fails.
std::vector<std::string> expand_glob(const std::string& pattern);

// A directory a process stages its output in beside the output NAME is named ".NAME.KIND-PID@HOST": hidden, and
// saying who made it, so that the next process can remove (or restore) what one that was killed left behind.
// `host` is how the caller names this host; it must name it the same way on every run.
struct StagingDirName {
  std::string kind, host;
  long pid = 0;
};
// This process's ".NAME.KIND-PID@HOST".
std::string staging_dir_name(const std::string& name, const std::string& kind, const std::string& host);
// `entry` taken apart when it is ".NAME.KIND-PID@HOST" for this `name`, of any kind; nullopt otherwise. A PID of
// more than 9 digits is not one: Linux's pids stay below 2^22, and 9 digits always fit pid_t.
std::optional<StagingDirName> parse_staging_dir_name(const std::string& entry, const std::string& name);
// Whether the process that made it is gone: it ran on `host` (this one) and no process has its pid now. A pid on
// another host says nothing about whether that process still runs there, so such a directory is never judged gone.
bool staging_owner_gone(const StagingDirName& s, const std::string& host);

// An exclusive flock(2) on a file, held until the object is destroyed or the process ends: the kernel releases it
// when the process dies, so kill -9 leaves no stale lock.
class FileLock {
 public:
  FileLock() = default;
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  enum Result { Taken, Held, Unsupported };
  // Creates `path` if needed and takes the lock without waiting, then writes `holder` (who holds it) into the file.
  // Held: another process has it; *other gets the file's text (its holder's line, "" if not written yet).
  // Unsupported: the filesystem has no flock (Lustre mounted without -o flock, say); *other gets the reason.
  // Throws Error naming the file when it cannot be opened or written.
  Result acquire(const std::string& path, const std::string& holder, std::string* other);

 private:
  int fd_ = -1;
};
}  // namespace yuan
