#include "backend/cpu_backend.h"

#include <cstring>

namespace yuan {

CpuBackend::CpuBackend(const BackendSpec& spec)
    : Backend(spec), param_mem_(size(), Mem::Params), grad_mem_(sharded() ? 0 : size(), Mem::Grads),
      ops_(make_cpu_ops()) {
  weights_ = Tensor(param_mem_.data(), DType::F32, 1, static_cast<int64_t>(size()));
  if (!sharded()) grads_ = Tensor(grad_mem_.data(), DType::F32, 1, static_cast<int64_t>(size()));
}

void CpuBackend::set_params(const float* src, size_t off, size_t n) {
  check_range(off, n);
  std::memcpy(param_mem_.data() + off, src, n * sizeof(float));
}

void CpuBackend::get_params(float* dst, size_t off, size_t n) {
  check_range(off, n);
  std::memcpy(dst, param_mem_.data() + off, n * sizeof(float));
}

void CpuBackend::zero_grads(size_t off, size_t n) {
  check_range(off, n);
  YUAN_CHECK(!sharded(), "cpu backend: no flat gradients under ZeRO-3");
  std::memset(grad_mem_.data() + off, 0, n * sizeof(float));
}

void CpuBackend::grads_to_host(size_t off, size_t n, float* dst) {
  check_range(off, n);
  YUAN_CHECK(!sharded(), "cpu backend: no flat gradients under ZeRO-3");
  std::memcpy(dst, grad_mem_.data() + off, n * sizeof(float));
}

std::unique_ptr<Backend> make_cpu_backend(const BackendSpec& spec) { return std::make_unique<CpuBackend>(spec); }

}  // namespace yuan
