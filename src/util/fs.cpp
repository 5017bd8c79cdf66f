#include "util/fs.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/error.h"

namespace yuan {

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

}  // namespace yuan
