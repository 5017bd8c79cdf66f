// CudaAdamW (backend/cuda_adamw.h): the optimizer state of a range of a CUDA backend's flat buffer in device
// memory, updated by the backend's adamw op on its compute stream.
#include "backend/cuda_adamw.h"

#include "backend/cuda_backend.h"
#include "common.cuh"
#include "device.cuh"
#include "kernel_account.cuh"
#include "model/gpt.h"

namespace yuan {

struct CudaAdamW::State {
  Backend* backend = nullptr;
  size_t offset = 0, count = 0;
  Allocation memory;  // master | m | v (count floats each)
  std::vector<DecaySegment> segments;
  cudaStream_t stream() const { return backend->stream(); }
  float* master() const { return memory.as<float>(); }
};

CudaAdamW::CudaAdamW(Backend& cuda_backend, size_t offset, size_t count, const float* init_master,
                     const std::vector<DecaySegment>& segments)
    : s_(std::make_unique<State>()) {
  YUAN_CHECK(cuda_backend.device() == Device::Cuda, "GPU AdamW needs the cuda backend, not '%s'", cuda_backend.name());
  YUAN_CHECK(offset + count <= cuda_backend.size(), "GPU AdamW: range [%zu, %zu) outside the %zu parameters",
             offset, offset + count, cuda_backend.size());
  s_->backend = &cuda_backend;
  s_->offset = offset;
  s_->count = count;
  const size_t bytes = 3 * count * sizeof(float);
  const size_t free_bytes = cuda_free_bytes();
  YUAN_CHECK(bytes <= free_bytes, "GPU AdamW: needs %.2f GiB for the fp32 master weights and moments of %zu "
             "parameters, device has %.2f GiB free; keep the optimizer on the host (optim.offload = host)",
             bytes / 1073741824.0, count, free_bytes / 1073741824.0);
  s_->memory = gpu::device_allocation(bytes);  // the moments start at zero
  gpu::copy_async(s_->master(), init_master, count * sizeof(float), cudaMemcpyHostToDevice, s_->stream());
  gpu::wait_stream(s_->stream(), "GPU AdamW's master weights upload");
  size_t next = offset;  // the segments tile the range, in order
  for (const DecaySegment& seg : segments) {
    YUAN_CHECK(seg.offset == next && seg.offset + seg.count <= offset + count, "GPU AdamW: decay segment [%zu, %zu) "
               "does not continue the range [%zu, %zu) at %zu", seg.offset, seg.offset + seg.count, offset,
               offset + count, next);
    next += seg.count;
  }
  YUAN_CHECK(next == offset + count, "GPU AdamW: the decay segments end at %zu, the range at %zu", next,
             offset + count);
  s_->segments = segments;
}

CudaAdamW::~CudaAdamW() = default;

double CudaAdamW::grad_sum_squares() {
  return s_->backend->ops().sum_squares(s_->backend->grads().elements(s_->offset, s_->count));
}

void CudaAdamW::step(const ops::AdamWHyper& h) {
  Backend& b = *s_->backend;
  const auto f32 = [](float* p, size_t n) { return Tensor(p, DType::F32, 1, static_cast<int64_t>(n)); };
  float *master = s_->master(), *m = master + s_->count, *v = m + s_->count;
  // Every decay segment's update is one call of the op: master, m, v and gradient in fp32, the bf16 working copy.
  for (const DecaySegment& seg : s_->segments) {
    ops::AdamWHyper hs = h;
    hs.weight_decay = seg.decay ? h.weight_decay : 0.0;
    const size_t i = seg.offset - s_->offset;
    b.ops().adamw(f32(master + i, seg.count), f32(m + i, seg.count), f32(v + i, seg.count),
                  b.grads().elements(seg.offset, seg.count), b.weights().elements(seg.offset, seg.count), hs);
  }
  gpu::wait_stream(s_->stream(), "GPU AdamW step");
}

void CudaAdamW::master_to_host(float* dst) {
  gpu::copy_async(dst, s_->master(), s_->count * sizeof(float), cudaMemcpyDeviceToHost, s_->stream());
  gpu::wait_stream(s_->stream(), "GPU AdamW's master weights download");
}

}  // namespace yuan
