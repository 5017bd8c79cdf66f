// The kernel account on CUDA events (cuda/kernel_account.cu): what a step's work turns into. A cast (a scoped op:
// its kernel demangled, its FLOPs and bytes once per call), a GEMM (a library call timed under its op), a copy to
// the host (phase "transfer"), a kernel outside every scope (family "other", by its kernel's name), and work
// between steps, which is not counted. The times themselves are the device's (or, on the emulator, the host's
// clock): only their consistency is checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cast.cuh"
#include "gpu_test.h"
#include "kernel_account.cuh"
#include "matmul.cuh"

namespace {

using namespace yuan;
using namespace yuan::test;
namespace gpu = yuan::gpu;

__global__ void unscoped_fill(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 1.0f;
}

const AccountedOp* find(const KernelReport& r, const std::string& name, const std::string& phase) {
  const auto it = std::find_if(r.ops.begin(), r.ops.end(),
                               [&](const AccountedOp& op) { return op.name == name && op.phase == phase; });
  return it == r.ops.end() ? nullptr : &*it;
}

TEST(KernelAccount, StepOfScopedAndUnscopedWork) {
  YUAN_REQUIRE_GPU();
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int n = 1024, N = 32, C = 64, OC = 96;
  DevArray<float> f(std::vector<float>(n, 0.5f));
  DevArray<uint16_t> h(n);
  auto* h16 = reinterpret_cast<gpu::bf16*>(h.get());
  DevArray<uint16_t> in(std::vector<uint16_t>(N * C, 0x3f80)), w(std::vector<uint16_t>(OC * C, 0x3f80)), out(N * OC);
  DevArray<float> workspace(gpu::Matmul::kWorkspaceBytes / sizeof(float)), bias_scratch(OC);
  CUDA_CHECK(cudaDeviceSynchronize());  // the arrays' fills, on the legacy stream, which `s` does not wait for
  gpu::Matmul gemm(workspace.get(), bias_scratch.get(), OC);
  const auto b16 = [](DevArray<uint16_t>& a) { return reinterpret_cast<gpu::bf16*>(a.get()); };
  float host[4];
  {
    std::unique_ptr<KernelAccount> account = gpu::make_kernel_account(s);
    gpu::f32_to_bf16(h16, f.get(), n, s);  // before the step: not counted
    account->begin_step();
    gpu::push_phase("forward");
    gpu::f32_to_bf16(h16, f.get(), n, s);
    gpu::f32_to_bf16(h16, f.get(), n, s);
    {
      const gpu::OpScope op({"matmul_forward", "matmul", {"N=%lld C=%lld OC=%lld", {N, C, OC}},
                             ops::matmul_forward_cost(N, C, OC, {2, 2}, false, false, false)});
      gemm.forward(b16(out), b16(in), b16(w), nullptr, nullptr, nullptr, N, C, OC, OC, s);
    }
    gpu::launch(unscoped_fill, gpu::ceil_div(n, 256), 256, 0, s, f.get(), n);
    gpu::copy_async(host, f.get(), sizeof host, cudaMemcpyDeviceToHost, s);
    gpu::pop_phase();
    account->end_step();
    gpu::f32_to_bf16(h16, f.get(), n, s);  // after it: not counted either
    CUDA_CHECK(cudaStreamSynchronize(s));
    const KernelReport r = account->report();

    const AccountedOp* cast = find(r, "cast_f32_to_bf16", "forward");
    ASSERT_TRUE(cast);
    EXPECT_EQ(cast->family, "cast");
    EXPECT_EQ(cast->shape, "n=1024");
    EXPECT_EQ(cast->calls, 2);
    EXPECT_EQ(cast->launches, 2);
    EXPECT_DOUBLE_EQ(cast->ideal_bytes, 2 * ops::copy_cost(n, 4, 2).bytes);
    ASSERT_EQ(cast->kernels.size(), 1u);
    EXPECT_NE(cast->kernels[0].name.find("f32_to_bf16_kernel"), std::string::npos) << cast->kernels[0].name;
    EXPECT_EQ(cast->kernels[0].name.find('('), std::string::npos) << cast->kernels[0].name;  // no parameter list

    const AccountedOp* mm = find(r, "matmul_forward", "forward");
    ASSERT_TRUE(mm);
    EXPECT_EQ(mm->calls, 1);
    EXPECT_DOUBLE_EQ(mm->flops, 2.0 * N * C * OC);
    ASSERT_EQ(mm->kernels.size(), 1u);
    EXPECT_EQ(mm->kernels[0].name, "cublasLt gemm");

    const AccountedOp* down = find(r, "memcpy DtoH", "transfer");
    ASSERT_TRUE(down);
    EXPECT_EQ(down->roof, Roof::Host);
    EXPECT_DOUBLE_EQ(down->ideal_bytes, sizeof host);

    const auto other =
        std::find_if(r.ops.begin(), r.ops.end(), [](const AccountedOp& op) { return op.family == "other"; });
    ASSERT_NE(other, r.ops.end());
    EXPECT_NE(other->name.find("unscoped_fill"), std::string::npos) << other->name;
    EXPECT_EQ(other->phase, "forward");
    EXPECT_EQ(r.ops.size(), 4u);

    EXPECT_EQ(r.untimed, 0);
    double total = 0;
    for (const AccountedOp& op : r.ops) {
      EXPECT_GE(op.time_s, 0) << op.name;
      total += op.time_s;
    }
    EXPECT_GE(r.step_s, r.busy_s);
    EXPECT_LE(r.busy_s, total + 1e-9);
    EXPECT_GT(r.peak.flops, 0);
    EXPECT_GT(r.peak.bytes_per_s, 0);
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
