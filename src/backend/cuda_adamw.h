// CudaAdamW (cuda/cuda_adamw.cu): an optimizer for the kernel tests and the GPU benchmarks, over a range of a CUDA
// backend's flat buffers through the backend's adamw and sum_squares ops, as the trainer's optim/device_adamw.h
// does over a ZeRO shard. Apart from backend/cuda_backend.h so that the backend's production header carries none
// of it.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "ops/adamw.h"

namespace yuan {

// A run of a flat buffer with or without weight decay (model/gpt.h decay_segments makes them): declared, not
// included, as the backend knows no model; the caller, which knows it, hands the runs over.
struct DecaySegment;

// AdamW with its state on the GPU, for benchmarks that compare ZeRO-Offload with a GPU-resident optimizer: fp32
// master weights and both moments of the range [offset, offset+count) of a CUDA backend's flat buffer stay in
// device memory, and each step writes the new weights into the backend's bf16 working copy (cuda/adamw_kernel.cu:
// the math of ops/adamw.h).
class CudaAdamW {
 public:
  // `segments`: the range cut where weight decay changes (decay_segments(layout, offset, offset + count)).
  CudaAdamW(Backend& cuda_backend, size_t offset, size_t count, const float* init_master,
            const std::vector<DecaySegment>& segments);
  ~CudaAdamW();
  CudaAdamW(const CudaAdamW&) = delete;
  CudaAdamW& operator=(const CudaAdamW&) = delete;
  // Sum of squares of the backend's fp32 gradient over the range, in double (for the global clipping norm).
  double grad_sum_squares();
  // One step over the range from the backend's gradient: h.weight_decay applies to the segments that decay
  // (matrices and embeddings), none to the others (biases, LayerNorm, the padding tail).
  void step(const ops::AdamWHyper& h);
  // fp32 master weights of the range, into host memory (count values).
  void master_to_host(float* dst);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace yuan
