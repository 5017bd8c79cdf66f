// SHA-256 through OpenSSL's libcrypto (which uses the CPU's SHA extensions where there are any), for the
// checksums in shard manifests, checkpoints and tokenizer names.
#pragma once
#include <string>

namespace yuan {

std::string sha256_hex(const std::string& bytes);  // lower-case hex
std::string sha256_file(const std::string& path);  // throws Error naming the file

}  // namespace yuan
