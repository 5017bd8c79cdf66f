#include "util/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "util/error.h"

namespace yuan {

namespace {

std::string hex(const unsigned char* md, unsigned n) {
  static const char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (unsigned i = 0; i < n; i++) {
    out[2 * i] = digits[md[i] >> 4];
    out[2 * i + 1] = digits[md[i] & 15];
  }
  return out;
}

// Files are checkpoint shards of gigabytes: large reads keep the syscalls out of the profile.
constexpr size_t kBlock = 8 << 20;

}  // namespace

std::string sha256_hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  YUAN_CHECK(EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr) == 1, "sha256: libcrypto failed");
  return hex(md, n);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  YUAN_CHECK(ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1, "sha256: libcrypto failed");
}

void Sha256::update(const void* data, size_t n) {
  YUAN_CHECK(EVP_DigestUpdate(ctx_.get(), data, n) == 1, "sha256: libcrypto failed");
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  YUAN_CHECK(EVP_DigestFinal_ex(ctx_.get(), md, &len) == 1, "sha256: libcrypto failed");
  return yuan::hex(md, len);
}

std::string sha256_file(const std::string& path) {
  Sha256 digest;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open for checksum: %s", path.c_str(), std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(kBlock);
  int read_errno = 0;
  try {
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) != 0;) {
      if (n > 0) digest.update(buf.data(), static_cast<size_t>(n));
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
  return digest.hex();
}

}  // namespace yuan
