#include "util/log.h"

#include <chrono>
#include <cstdarg>
#include <cstdio>

#include "util/error.h"

namespace yuan {

static void vput(FILE* f, const char* prefix, const char* fmt, va_list ap) {
  std::string line = prefix;
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  std::string body(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(body.data(), body.size(), fmt, ap2);
  va_end(ap2);
  body.resize(static_cast<size_t>(n));
  line += body;
  line += '\n';
  std::fputs(line.c_str(), f);  // one write per line keeps lines from different ranks whole
  std::fflush(f);
}

void say(const char* fmt, ...) {
  if (process_rank() != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vput(stdout, "", fmt, ap);
  va_end(ap);
}

void say_all(const char* fmt, ...) {
  std::string prefix = strf("[rank %d@%s] ", process_rank(), process_host().c_str());
  va_list ap;
  va_start(ap, fmt);
  vput(stdout, prefix.c_str(), fmt, ap);
  va_end(ap);
}

void warn(const char* fmt, ...) {
  if (process_rank() != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vput(stderr, "warning: ", fmt, ap);
  va_end(ap);
}

void warn_all(const char* fmt, ...) {
  std::string prefix = strf("warning: [rank %d@%s] ", process_rank(), process_host().c_str());
  va_list ap;
  va_start(ap, fmt);
  vput(stderr, prefix.c_str(), fmt, ap);
  va_end(ap);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace yuan
