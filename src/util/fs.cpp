#include "util/fs.h"

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace yuan {

void read_file_chunks(const std::string& path, const std::function<void(const char*, size_t)>& use) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open for checksum: %s", path.c_str(), std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(size_t{8} << 20);  // checkpoint shards of gigabytes: large reads keep syscalls out of it
  int read_errno = 0;
  try {
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) != 0;) {
      if (n > 0) use(buf.data(), static_cast<size_t>(n));
      else if (errno != EINTR) {
        read_errno = errno;
        break;
      }
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  YUAN_CHECK(!read_errno, "%s: read error while computing checksum: %s", path.c_str(), std::strerror(read_errno));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  YUAN_CHECK(fd >= 0, "cannot create '%s': %s", tmp.c_str(), std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      throw Error(strf("cannot write '%s': %s", tmp.c_str(), std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  bool ok = ::fsync(fd) == 0;
  ok = ::close(fd) == 0 && ok;
  YUAN_CHECK(ok, "cannot flush '%s': %s", tmp.c_str(), std::strerror(errno));
  YUAN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '%s' to '%s': %s", tmp.c_str(),
             path.c_str(), std::strerror(errno));
  sync_dir(std::filesystem::path(path).parent_path().string());
}

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "cannot open '%s' to flush it: %s", path.c_str(), std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  YUAN_CHECK(ok, "cannot flush '%s': %s", path.c_str(), std::strerror(e));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  YUAN_CHECK(in, "cannot read '%s': %s", path.c_str(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  YUAN_CHECK(!in.bad(), "cannot read '%s': %s", path.c_str(), std::strerror(errno));
  return ss.str();
}

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  YUAN_CHECK(fd >= 0, "cannot open directory '%s': %s", dir.c_str(), std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  YUAN_CHECK(!ec, "cannot create directory '%s': %s", dir.c_str(), ec.message().c_str());
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  globfree(&g);
  YUAN_CHECK(rc == 0 || rc == GLOB_NOMATCH, "%s: cannot expand glob (error %d)", pattern.c_str(), rc);
  return paths;
}

std::string staging_dir_name(const std::string& name, const std::string& kind, const std::string& host) {
  return strf(".%s.%s-%ld@%s", name.c_str(), kind.c_str(), static_cast<long>(::getpid()), host.c_str());
}

std::optional<StagingDirName> parse_staging_dir_name(const std::string& entry, const std::string& name) {
  const std::string prefix = "." + name + ".";
  if (entry.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string rest = entry.substr(prefix.size());
  const size_t dash = rest.find('-'), at = rest.find('@');
  if (dash == 0 || dash == std::string::npos || at == std::string::npos || at < dash + 2 || at > dash + 10)
    return std::nullopt;
  const std::string pid = rest.substr(dash + 1, at - dash - 1);
  if (pid.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return StagingDirName{rest.substr(0, dash), rest.substr(at + 1), std::stol(pid)};
}

bool staging_owner_gone(const StagingDirName& s, const std::string& host) {
  return s.host == host && ::kill(static_cast<pid_t>(s.pid), 0) != 0 && errno == ESRCH;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

FileLock::Result FileLock::acquire(const std::string& path, const std::string& holder, std::string* other) {
  YUAN_CHECK(fd_ < 0, "%s: lock taken twice", path.c_str());
  // CLOEXEC: a child process would otherwise keep the lock after this one dies.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  YUAN_CHECK(fd >= 0, "cannot open the lock file '%s': %s", path.c_str(), std::strerror(errno));
  int rc;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int e = errno;
    ::close(fd);
    if (e != EWOULDBLOCK) {
      *other = std::strerror(e);
      return Unsupported;
    }
    *other = read_text(path);
    while (!other->empty() && (other->back() == '\n' || other->back() == ' ')) other->pop_back();
    return Held;
  }
  fd_ = fd;
  const std::string line = holder + "\n";
  bool ok = ::ftruncate(fd, 0) == 0 && ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  YUAN_CHECK(ok, "cannot write the lock file '%s': %s", path.c_str(), std::strerror(errno));
  return Taken;
}

}  // namespace yuan
