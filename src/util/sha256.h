// SHA-256 (FIPS 180-4), for the checksums in shard manifests and tokenizer names: small enough to carry rather
// than link a crypto library on machines where only the compiler is guaranteed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace yuan {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // finishes the digest; the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const std::string& bytes);
std::string sha256_file(const std::string& path);  // throws Error naming the file

}  // namespace yuan
