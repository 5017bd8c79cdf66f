// The CUDA backend (cuda/cuda_backend.cu): the Backend contract of backend/backend.h on one GPU, with kernels
// from cuda/ and GEMMs from cuBLASLt. Plain C++: host code includes this, never a CUDA header.
//
// Device memory (cudaMalloc only): bf16 working weights; fp32 gradients, so that micro-batches accumulate
// without bf16 rounding and the host optimizer and the Communicator get them as they are (grad_buffer() is F32);
// bf16 activations. With `recompute`, only each block's input is kept from forward and backward re-runs the
// block's forward before its backward: activations shrink from 16 values per token, channel and layer to 1, for
// about one more forward pass of compute.
//
// Every public call returns with its device work finished, so the buffers are safe to hand to anything, except
// the asynchronous transfers of backend.h (grads_to_host_async, params_from_host_async), which complete at
// wait_transfers / wait_upload, and the backward's ready hook, which fires in stream order.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "ops/adamw.h"

namespace yuan {

// True when the CUDA runtime sees at least one device.
bool cuda_device_available();
// Makes device local_rank % device count current for this process (one rank per GPU on a node, several when
// there are more ranks than GPUs) and returns its index. Call before creating the backend and the communicator.
int cuda_select_device(int local_rank);

// Dense bf16 tensor-core peak of the current device from NVIDIA's datasheets (H100 SXM and H200 989 TFLOP/s,
// H100 PCIe 756, H100 NVL and H200 NVL 835, A100 312), else estimated from SM count and clock for sm_80 and
// sm_90; the source says which. MFU everywhere on the GPU is a fraction of this.
PeakFlops cuda_peak_flops();

// Device bytes of a CUDA backend by purpose: what its constructor allocates (parameter count unpadded).
struct CudaMemoryPlan {
  size_t weights = 0;      // bf16 working weights
  size_t grads = 0;        // fp32 gradients
  size_t activations = 0;  // kept from forward for backward, logits included
  size_t buffers = 0;      // backward scratch, cuBLASLt workspace, staging, token upload
  size_t total() const { return weights + grads + activations + buffers; }
};
CudaMemoryPlan plan_cuda_memory(const GPTConfig& cfg, int micro_batch, bool recompute);
// Throws the one-line Error "memory plan: needs X GiB on the GPU (...), device has Y GiB free; try ..." when the
// plan does not fit in free_bytes.
void check_cuda_memory(const GPTConfig& cfg, int micro_batch, bool recompute, size_t free_bytes);

// Throws Error when there is no device, the plan does not fit, or the shape is unsupported (n_embd % 8 != 0,
// head size not a multiple of 8 or above 128).
std::unique_ptr<Backend> make_cuda_backend(const GPTConfig& cfg, int micro_batch, size_t padded_size,
                                           bool recompute = false);

// AdamW with its state on the GPU, for optim.offload=none: fp32 master weights and both moments of the range
// [offset, offset+count) of a CUDA backend's flat buffer stay in device memory, and each step writes the new
// weights into the backend's bf16 working copy (cuda/adamw.cu: the math of ops/adamw.h).
class CudaAdamW {
 public:
  CudaAdamW(Backend& cuda_backend, size_t offset, size_t count, const float* init_master);
  ~CudaAdamW();
  CudaAdamW(const CudaAdamW&) = delete;
  CudaAdamW& operator=(const CudaAdamW&) = delete;
  // Sum of squares of the backend's fp32 gradient over the range, in double (for the global clipping norm).
  double grad_sum_squares();
  // One step over the range from the backend's gradient: h.weight_decay applies to matrices and embeddings
  // (TensorSpec::decay), none to biases, LayerNorm and the padding tail.
  void step(const ops::AdamWHyper& h);
  // fp32 master weights of the range, into host memory (count values).
  void master_to_host(float* dst);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace yuan
