// The CUDA backend: device memory for the flat buffers, the streams, and the transfers of backend/backend.h on
// one GPU. Its ops are CudaOps (cuda_ops.cu); see src/backend/cuda_backend.h for the memory choices.
//
// Streams: compute (the ops, set/get_params, zero_grads), one for gradient copies to the host, and two upload
// lanes for working weights, ordered by events so that the host never waits inside backward.
#include "backend/cuda_backend.h"

#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "cast.cuh"
#include "cuda_ops.cuh"
#include "cudnn_attention.h"
#include "device.cuh"
#include "kernel_account.cuh"
#include "util/log.h"

namespace yuan {
namespace {

using gpu::bf16;

constexpr size_t kStageElems = size_t(16) << 20;  // fp32 staging of set_params / get_params: 64 MiB per chunk

// Work enqueued on `waiter` from now on runs after the work enqueued on `producer` so far; `ev` marks that
// point (an event may be recorded again at once: a wait takes the record it sees when enqueued).
void wait_for(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t ev) {
  CUDA_CHECK(cudaEventRecord(ev, producer));
  CUDA_CHECK(cudaStreamWaitEvent(waiter, ev, 0));
}

void check_lane(int lane) { YUAN_CHECK(lane == 0 || lane == 1, "cuda backend: upload lane %d (0 or 1)", lane); }

size_t workspace_bytes(int width, int, int) { return gpu::ops_scratch_bytes(width) + kStageElems * sizeof(float); }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendSpec& spec) : Backend(spec) {
    YUAN_CHECK(spec.width > 0, "cuda backend: its ops need the row width they size their scratch for (got %d)",
               spec.width);
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    say("cuda: device %d %s (sm_%d%d), %.2f GiB free", dev, prop.name, prop.major, prop.minor,
        cuda_free_bytes() / 1073741824.0);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    for (cudaStream_t& s : up_) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&ev_compute_, &ev_after_, &ev_d2h_, &ev_other_, &ev_up_[0], &ev_up_[1]})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    const size_t n = size();
    weight_mem_ = gpu::device_allocation(n * sizeof(bf16));
    stage_ = gpu::device_allocation(kStageElems * sizeof(float));
    weights_ = Tensor(weight_mem_.as<bf16>(), DType::BF16, 1, static_cast<int64_t>(n));
    if (!sharded()) {
      grad_mem_ = gpu::device_allocation(n * sizeof(float));
      grads_ = Tensor(grad_mem_.as<float>(), DType::F32, 1, static_cast<int64_t>(n));
    }
    ops_ = gpu::make_cuda_ops(spec.width, spec.attention, stream_);
  }

  ~CudaBackend() override {
    // Work still queued on any stream may use the ops' scratch, the buffers or the caller's pinned memory, so
    // every stream drains first. Destructors do not throw: errors are ignored here.
    for (cudaStream_t s : {stream_, d2h_, up_[0], up_[1]})
      if (s) cudaStreamSynchronize(s);
    ops_.reset();
    for (cudaStream_t s : {stream_, d2h_, up_[0], up_[1]})
      if (s) cudaStreamDestroy(s);
    for (cudaEvent_t e : {ev_compute_, ev_after_, ev_d2h_, ev_other_, ev_up_[0], ev_up_[1]})
      if (e) cudaEventDestroy(e);
  }

  Device device() const override { return Device::Cuda; }
  Ops& ops() override { return *ops_; }
  PeakFlops peak_flops() override { return cuda_peak_flops(); }

  void set_params(const float* src, size_t off, size_t n) override {
    check_range(off, n);
    float* stage = stage_.as<float>();
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t chunk = std::min(kStageElems, n - i);
      gpu::copy_async(stage, src + i, chunk * sizeof(float), cudaMemcpyHostToDevice, stream_);
      gpu::f32_to_bf16(weights_.as<bf16>() + off + i, stage, chunk, stream_);
    }
    gpu::wait_stream(stream_, "set_params");
  }
  void get_params(float* dst, size_t off, size_t n) override {
    check_range(off, n);
    float* stage = stage_.as<float>();
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t chunk = std::min(kStageElems, n - i);
      gpu::bf16_to_f32(stage, weights_.as<bf16>() + off + i, chunk, stream_);
      gpu::copy_async(dst + i, stage, chunk * sizeof(float), cudaMemcpyDeviceToHost, stream_);
    }
    gpu::wait_stream(stream_, "get_params");
  }
  void zero_grads(size_t off, size_t n) override {
    check_range(off, n);
    YUAN_CHECK(!sharded(), "cuda backend: no flat gradients under ZeRO-3");
    compute_after_transfers();  // the copies still reading them; compute enqueued later sees the zeros
    gpu::fill_async(grads_.as<float>() + off, 0, n * sizeof(float), stream_);
  }
  void grads_to_host(size_t off, size_t n, float* dst) override {
    check_range(off, n);
    YUAN_CHECK(!sharded(), "cuda backend: no flat gradients under ZeRO-3");
    gpu::copy_async(dst, grads_.as<float>() + off, n * sizeof(float), cudaMemcpyDeviceToHost, stream_);
    gpu::wait_stream(stream_, "grads_to_host");
  }

  Allocation alloc(size_t bytes, Mem) override { return gpu::device_allocation(bytes); }
  Allocation alloc_transfer(size_t bytes, Mem cat) override { return gpu::pinned_allocation(bytes, cat); }

  DeviceStream stream() override { return stream_; }
  void to_host_async(float* dst, const Tensor& src, DeviceStream after) override {
    YUAN_CHECK(src.dtype == DType::F32 && src.ld == src.cols, "cuda backend: to_host_async takes a dense fp32 tensor");
    wait_for(d2h_, stream_, ev_compute_);
    if (after) wait_for(d2h_, after, ev_after_);
    gpu::copy_async(dst, src.data, src.numel() * sizeof(float), cudaMemcpyDeviceToHost, d2h_);
  }
  void wait_transfers() override { gpu::wait_stream(d2h_, "the gradient copies to the host"); }
  void compute_after_transfers() override { wait_for(stream_, d2h_, ev_d2h_); }
  void compute_after(DeviceStream other) override {
    if (other) wait_for(stream_, other, ev_other_);
  }
  void params_from_host_async(const void* src, size_t off, size_t n, int lane) override {
    check_range(off, n);
    check_lane(lane);
    // Compute already enqueued may still read the old weights; compute enqueued later must read the new ones.
    wait_for(up_[lane], stream_, ev_compute_);
    gpu::copy_async(weights_.as<bf16>() + off, src, n * sizeof(bf16), cudaMemcpyHostToDevice, up_[lane]);
    wait_for(stream_, up_[lane], ev_up_[lane]);
  }
  void wait_upload(int lane) override {
    check_lane(lane);
    gpu::wait_event(ev_up_[lane], "a weight upload lane");
  }

  void profiler(bool capture) override { CUDA_CHECK(capture ? cudaProfilerStart() : cudaProfilerStop()); }
  // The ranges name the phases of nsys's timeline and of the kernel account.
  void range_push(const char* name) override {
    nvtxRangePushA(name);
    gpu::push_phase(name);
  }
  void range_pop() override {
    nvtxRangePop();
    gpu::pop_phase();
  }
  std::unique_ptr<KernelAccount> kernel_account() override { return gpu::make_kernel_account(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaStream_t d2h_ = nullptr, up_[2] = {};  // gradient copies; weight upload lanes
  cudaEvent_t ev_compute_ = nullptr, ev_after_ = nullptr, ev_d2h_ = nullptr, ev_other_ = nullptr, ev_up_[2] = {};
  Allocation weight_mem_, grad_mem_, stage_;
  std::unique_ptr<Ops> ops_;
};

}  // namespace

const TensorFormats& cuda_tensor_formats() {
  // The attention keeps its logsumexp per (row, head) and its backward needs as many floats of scratch (delta).
  // The kernels move 16-byte vectors of 8 bf16; the attention's are instantiated for heads of up to 128.
  static const TensorFormats f{DType::BF16,        DType::BF16,     gpu::attention_rows, gpu::attention_scratch,
                               gpu::logits_stride, gpu::token_slot, workspace_bytes,     8, 128};
  return f;
}

std::string cuda_cudnn_attention_problem(int head_size, int seq_len) {
  return gpu::cudnn_attention_problem(head_size, seq_len, !cuda_device_available());
}

std::string cuda_cudnn_attention_library() { return gpu::cudnn_attention_library(); }

std::unique_ptr<Backend> make_cuda_backend(const BackendSpec& spec) {
  YUAN_CHECK(cuda_device_available(), "train.device=cuda: no CUDA device is visible to this process");
  return std::make_unique<CudaBackend>(spec);
}

}  // namespace yuan
