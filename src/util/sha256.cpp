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

std::string sha256_file(const std::string& path) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  YUAN_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "%s: sha256: libcrypto failed",
             path.c_str());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  YUAN_CHECK(fd >= 0, "%s: cannot open for checksum: %s", path.c_str(), std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(kBlock);
  int read_errno = 0;
  bool digest_ok = true;
  for (ssize_t n; digest_ok && (n = ::read(fd, buf.data(), buf.size())) != 0;) {
    if (n > 0) digest_ok = EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n)) == 1;
    else if (errno != EINTR) {
      read_errno = errno;
      break;
    }
  }
  ::close(fd);
  YUAN_CHECK(!read_errno, "%s: read error while computing checksum: %s", path.c_str(), std::strerror(read_errno));
  YUAN_CHECK(digest_ok, "%s: sha256: libcrypto failed", path.c_str());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  YUAN_CHECK(EVP_DigestFinal_ex(ctx.get(), md, &len) == 1, "%s: sha256: libcrypto failed", path.c_str());
  return hex(md, len);
}

}  // namespace yuan
