// The CPU reference backend: fp32 weights, gradients and activations in host memory; the ops are src/ops's,
// behind the op vocabulary of backend/ops_interface.h (cpu_ops.cpp). Test doubles of the optimizer derive from it
// for its host buffers.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "util/memory.h"

namespace yuan {

const TensorFormats& cpu_tensor_formats();
std::unique_ptr<Ops> make_cpu_ops();

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendSpec& spec);
  Device device() const override { return Device::Cpu; }
  Ops& ops() override { return *ops_; }

  void set_params(const float* src, size_t offset, size_t count) override;
  void get_params(float* dst, size_t offset, size_t count) override;
  void zero_grads(size_t offset, size_t count) override;
  void grads_to_host(size_t offset, size_t count, float* dst) override;
  Allocation alloc(size_t bytes, Mem cat) override { return host_allocation(bytes, cat); }

 protected:
  HostArray<float> param_mem_, grad_mem_;

 private:
  std::unique_ptr<Ops> ops_;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendSpec& spec);

}  // namespace yuan
