#include "util/rng.h"

#include <cmath>

namespace yuan {

void Rng::fill_normal(float* out, size_t n, float std) {
  for (size_t i = 0; i < n; i += 2) {
    // u1 in (0,1] so log() is finite
    double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(2.0 * M_PI * u2)) * std;
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2)) * std;
  }
}

}  // namespace yuan
