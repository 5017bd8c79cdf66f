// SHA-256 through OpenSSL's libcrypto (which uses the CPU's SHA extensions where there are any), for the
// checksums in shard manifests, checkpoints and tokenizer names.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

struct evp_md_ctx_st;

namespace yuan {

// A digest fed piece by piece: for bytes that are hashed as they are written, in one pass over them.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // lower-case hex; once, at the end
 private:
  std::unique_ptr<evp_md_ctx_st, void (*)(evp_md_ctx_st*)> ctx_;
};

std::string sha256_hex(const std::string& bytes);  // lower-case hex
std::string sha256_file(const std::string& path);  // throws Error naming the file

}  // namespace yuan
