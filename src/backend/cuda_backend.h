// The CUDA backend (cuda/): the Backend contract of backend/backend.h on one GPU, the op vocabulary of
// backend/ops_interface.h on the kernels of cuda/ and cuBLASLt GEMMs. Plain C++: host code includes this, never a CUDA
// header.
//
// Device memory (cudaMalloc only): bf16 working weights; fp32 gradients, so that micro-batches accumulate without
// bf16 rounding and the host optimizer and the Communicator get them as they are (grads() is F32); bf16
// activations, allocated by the programs that run on it (program/program.h).
//
// Every public call returns with its device work finished, so the buffers are safe to hand to anything, except
// the ops (enqueued on stream()), the asynchronous transfers of backend.h (to_host_async,
// params_from_host_async), which complete at wait_transfers / wait_upload, and the backward's ready hook, which
// fires in stream order.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace yuan {

// True when the CUDA runtime sees at least one device.
bool cuda_device_available();
// Makes device local_rank % device count current for this process (one rank per GPU on a node, several when
// there are more ranks than GPUs) and returns its index. Call before creating the backend and the communicator.
int cuda_select_device(int local_rank);
// Free memory of the current device.
size_t cuda_free_bytes();

// Dense bf16 tensor-core peak of the current device from NVIDIA's datasheets (H100 SXM and H200 989 TFLOP/s,
// H100 PCIe 756, H100 NVL and H200 NVL 835, A100 312), else estimated from SM count and clock for sm_80 and
// sm_90; the source says which. MFU everywhere on the GPU is a fraction of this.
PeakFlops cuda_peak_flops();

// bf16 weights and activations, the attention's logsumexp per row as its saved state, logits rows padded to 64;
// rows of whole 8-element vectors, heads of at most 128.
const TensorFormats& cuda_tensor_formats();

// Why cuDNN's fused attention cannot run heads of `head_size` over `seq_len` positions in this process, or ""
// (cuda/cudnn_attention.h); where no device is visible (planning on a login node), only the build and the shape
// decide.
std::string cuda_cudnn_attention_problem(int head_size, int seq_len);
// The cuDNN and frontend versions the cuDNN attention runs on, or "".
std::string cuda_cudnn_attention_library();

// Throws Error when there is no device.
std::unique_ptr<Backend> make_cuda_backend(const BackendSpec& spec);

}  // namespace yuan
