#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "util/error.h"

namespace yuan {

MappedFile::MappedFile(const std::string& path, bool sequential) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(strf("%s: cannot stat: %s", path.c_str(), std::strerror(err)));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  void* p = size_ > 0 ? ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  YUAN_CHECK(p != MAP_FAILED, "%s: cannot map: %s", path.c_str(), std::strerror(err));
  data_ = static_cast<const uint8_t*>(p);
  if (data_ && sequential) ::madvise(p, size_, MADV_SEQUENTIAL);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace yuan
