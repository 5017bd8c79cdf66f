// GELU, tanh approximation (CPU twin: src/ops/gelu.cpp):
//   y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
//   dy/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 * 0.044715 x^2)
// The training path fuses GELU into the MLP's GEMMs (cuBLASLt epilogues, matmul.cu); these kernels stand in for
// a shape where cuBLASLt offers no fused algorithm.
#include "gelu.cuh"

namespace yuan::gpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, size_t packs) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < packs; i += size_t(gridDim.x) * blockDim.x) {
    PackBf16 x = load_pack(inp + i * PackBf16::kN), y;
#pragma unroll
    for (int k = 0; k < PackBf16::kN; k++) {
      float v = __bfloat162float(x.v[k]);
      y.v[k] = __float2bfloat16(0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v))));
    }
    store_pack(out + i * PackBf16::kN, y);
  }
}

__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, size_t packs) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < packs; i += size_t(gridDim.x) * blockDim.x) {
    PackBf16 x = load_pack(inp + i * PackBf16::kN), d = load_pack(dout + i * PackBf16::kN), o;
#pragma unroll
    for (int k = 0; k < PackBf16::kN; k++) {
      float v = __bfloat162float(x.v[k]);
      float th = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
      float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
      o.v[k] = __float2bfloat16(grad * __bfloat162float(d.v[k]));
    }
    store_pack(dinp + i * PackBf16::kN, o);
  }
}

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t s) {
  YUAN_CHECK(n % PackBf16::kN == 0, "gelu_forward: %zu elements, not a multiple of %d", n, PackBf16::kN);
  launch(gelu_forward_kernel, grid_for(n / PackBf16::kN, 256), 256, 0, s, out, inp, n / PackBf16::kN);
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, cudaStream_t s) {
  YUAN_CHECK(n % PackBf16::kN == 0, "gelu_backward: %zu elements, not a multiple of %d", n, PackBf16::kN);
  launch(gelu_backward_kernel, grid_for(n / PackBf16::kN, 256), 256, 0, s, dinp, inp, dout, n / PackBf16::kN);
}

}  // namespace yuan::gpu
