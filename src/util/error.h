// Errors: every failure is a yuan::Error carrying one line that names what went wrong (file, key, rank).
// main() prints it prefixed with rank and host and ends the whole job; no rank is left waiting.
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

namespace yuan {

class Error : public std::runtime_error {
 public:
  // `collective`: every rank raises the same error at the same point (e.g. a bad config), so rank 0 alone
  // reports it and all ranks exit cleanly instead of aborting.
  explicit Error(const std::string& msg, bool collective = false)
      : std::runtime_error(msg), collective_(collective) {}
  bool collective() const { return collective_; }

 private:
  bool collective_;
};

// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Identity of this process for messages: "rank 3 on node17". Set once by comm::init().
void set_process_identity(int rank, const std::string& host);
int process_rank();
const std::string& process_host();

}  // namespace yuan

#define YUAN_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::yuan::Error(::yuan::strf(__VA_ARGS__)); \
  } while (0)
