// Console output. `say` prints on rank 0 only (the step line, the config); `say_all` prefixes the rank and
// prints everywhere (warnings that differ between ranks).
#pragma once
#include <string>

namespace yuan {
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say_all(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));  // rank 0, to stderr
void warn_all(const char* fmt, ...) __attribute__((format(printf, 1, 2)));  // this rank, named, to stderr
double now_seconds();  // monotonic wall clock
}  // namespace yuan
