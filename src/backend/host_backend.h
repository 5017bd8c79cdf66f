// The buffer half of the Backend contract for backends that keep fp32 weights and gradients in host memory
// (the CPU backend, and the test doubles of the optimizer tests): the optimizer's ranges are plain copies.
#pragma once
#include <cstring>

#include "backend/backend.h"
#include "util/error.h"
#include "util/memory.h"

namespace yuan {

class HostBackend : public Backend {
 public:
  HostBackend(const GPTConfig& c, size_t padded)
      : layout_(c), padded_(padded), params_(padded, Mem::Params), grads_(padded, Mem::Grads) {
    YUAN_CHECK(padded >= layout_.total(), "backend: padded size %zu < parameter count %zu", padded, layout_.total());
  }
  const ParamLayout& layout() const override { return layout_; }
  size_t padded_size() const override { return padded_; }

  void set_params(const float* src, size_t off, size_t n) override {
    check_range(off, n);
    std::memcpy(params_.data() + off, src, n * sizeof(float));
  }
  void get_params(float* dst, size_t off, size_t n) override {
    check_range(off, n);
    std::memcpy(dst, params_.data() + off, n * sizeof(float));
  }
  void zero_grads(size_t off, size_t n) override {
    check_range(off, n);
    std::memset(grads_.data() + off, 0, n * sizeof(float));
  }
  DeviceBuffer grad_buffer() override { return {grads_.data(), padded_, DType::F32}; }
  DeviceBuffer param_buffer() override { return {params_.data(), padded_, DType::F32}; }
  void grads_to_host(size_t off, size_t n, float* dst) override {
    check_range(off, n);
    std::memcpy(dst, grads_.data() + off, n * sizeof(float));
  }

 protected:
  void check_range(size_t off, size_t n) const {
    YUAN_CHECK(off + n <= padded_, "%s backend: range [%zu, %zu) outside the %zu-element buffer", name(), off, off + n,
               padded_);
  }
  ParamLayout layout_;
  size_t padded_;
  HostArray<float> params_, grads_;
};

}  // namespace yuan
