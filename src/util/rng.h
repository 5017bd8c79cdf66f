// Counter-based random numbers (SplitMix64 over (seed, stream, counter)): any element of any stream can be
// produced independently, so results do not depend on thread count or on the order tensors are visited, and
// the generator state to checkpoint is just (seed, stream, counter).
#pragma once
#include <cstddef>
#include <cstdint>

namespace yuan {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) : key_(splitmix64(seed ^ splitmix64(stream + 0x5851F42D4C957F2Dull))) {}
  uint64_t next_u64() { return splitmix64(key_ + 0x9E3779B97F4A7C15ull * ++counter_); }
  float next_uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }  // [0,1)
  void fill_normal(float* out, size_t n, float std);  // Box-Muller
  uint64_t counter() const { return counter_; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace yuan
