#include "util/error.h"

#include <cstdarg>
#include <vector>

namespace yuan {

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::vector<char> buf(static_cast<size_t>(n) + 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
  va_end(ap2);
  return std::string(buf.data(), static_cast<size_t>(n));
}

namespace {
int g_rank = 0;
std::string g_host = "localhost";
}  // namespace

void set_process_identity(int rank, const std::string& host) {
  g_rank = rank;
  g_host = host;
}
int process_rank() { return g_rank; }
const std::string& process_host() { return g_host; }

}  // namespace yuan
