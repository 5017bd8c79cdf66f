// Linear layers on cuBLASLt (matmul.cu; CPU twin src/ops/matmul.cpp): out = inp @ w^T + bias, w stored [OC, C],
// bf16 operands, fp32 accumulation.
#pragma once
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common.cuh"

namespace yuan::gpu {

// One per set of ops: it owns the handle and the per-shape plans and uses the workspace and bias scratch it is
// given (they are part of the memory plan).
class Matmul {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
  Matmul(void* workspace, float* bias_scratch, size_t bias_scratch_count);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  // out[N,OC] (row stride ld_out) = inp[N,C] @ w[OC,C]^T + bias[OC] + residual[N,OC]; bias and residual may be
  // null. With pre_gelu: pre_gelu = that sum and out = gelu(pre_gelu), for the MLP (fused GELU epilogue).
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, const bf16* residual, bf16* pre_gelu,
               int N, int C, int OC, int ld_out, cudaStream_t s);
  // dinp[N,C] = dout @ w, times gelu'(pre_gelu) when pre_gelu is given (the MLP's GELU backward, fused);
  // dw[OC,C] += dout^T @ inp and dbias[OC] += column sums of dout, both fp32. dout has row stride ld_dout.
  void backward(bf16* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp, const bf16* w,
                const bf16* pre_gelu, int N, int C, int OC, int ld_dout, cudaStream_t s);
  // false: skip the GELU_AUX_BIAS, DGELU and BGRADB epilogues and always take the unfused kernels that stand in
  // when cuBLASLt has no algorithm for them, so that tests can check that path on any GPU.
  bool fuse_epilogues = true;

 private:
  struct Plan;
  struct Call;
  bool run(const Call& c, cudaStream_t s);  // false: cuBLASLt has no algorithm for this fused epilogue
  Plan& plan(const Call& c);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  float* bias_scratch_;
  size_t bias_scratch_count_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace yuan::gpu
