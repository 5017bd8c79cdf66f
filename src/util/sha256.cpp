#include "util/sha256.h"

#include <openssl/evp.h>

#include <memory>

#include "util/error.h"
#include "util/fs.h"

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
  read_file_chunks(path, [&](const char* p, size_t n) { digest.update(p, n); });
  return digest.hex();
}

}  // namespace yuan
