// Shared helpers of the CUDA tests (bin/test_cuda): the no-GPU skip, device arrays, random inputs, the error
// metric, a GPT program on a backend.
//
// Error metric, as in tests/test_reference.cpp: max|a - ref| / max|ref| over a whole tensor (single elements can
// be ~0, so the tensor's scale is the yardstick); NaN anywhere makes it infinite. CPU references run in fp32 on
// the same bf16-rounded inputs the GPU gets, so a tolerance only has to cover the GPU's own roundings: a bf16
// output is within 2^-9 ~ 2e-3 of its fp32 value, and sums in a different order move fp32 results by ~1e-6.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "cuda_check.h"
#include "model/gpt.h"
#include "optim/replica.h"
#include "program/params.h"
#include "program/program.h"
#include "util/dtype.h"
#include "../test_util.h"

// First line of every GPU test: skips (does not fail) on machines without a usable device.
#define YUAN_REQUIRE_GPU()                                                                   \
  do {                                                                                       \
    int n_dev_ = 0;                                                                          \
    cudaError_t e_ = cudaGetDeviceCount(&n_dev_);                                            \
    if (e_ != cudaSuccess) GTEST_SKIP() << "no CUDA device: " << cudaGetErrorString(e_);     \
    if (n_dev_ == 0) GTEST_SKIP() << "no CUDA device: the runtime reports 0 devices";        \
  } while (0)

namespace yuan::test {

// Device memory for one test; filled with NaN bytes (0xff) at allocation, so an output a kernel forgets to
// write fails the comparison. Exactly n elements and no slack: under the emulator the bytes after them are no
// allocation's, so an access one element or one 16-byte pack past the end is an OutOfBounds report.
template <typename T>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    CUDA_CHECK(cudaMemset(p_, 0xff, n * sizeof(T)));
  }
  explicit DevArray(const std::vector<T>& host) : DevArray(host.size()) { upload(host); }
  ~DevArray() { cudaFree(p_); }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  T* get() { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> randn(size_t n, float std, uint32_t seed, float mean = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// bf16 bits of each value, and the values those bits stand for (what the GPU computes with).
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = bf16_to_f32(v[i]);
  return out;
}
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

using testing::rel_err;
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return rel_err(a.data(), ref.data(), std::min(a.size(), ref.size()));
}

// A replica on `device` (optim/replica.h, no optimizer) holding the modules the program of `spec` runs. With
// `weights` (the whole model's, in ParamLayout(cfg) order) the backend gets its modules' part of them.
using Model = Replica;
inline Model make_model(Device device, const GPTConfig& cfg, const ProgramSpec& spec, const float* weights) {
  const ParamLayout layout(cfg, held_modules(cfg, spec.modules.size() ? spec.modules : all_modules(cfg)));
  Model m;
  assemble_replica(m, {device, layout, backend_spec(layout), spec, weights});
  return m;
}

inline std::vector<float> grads_of(Backend& be) {
  std::vector<float> g(be.size());
  be.grads_to_host(0, g.size(), g.data());
  return g;
}

}  // namespace yuan::test
