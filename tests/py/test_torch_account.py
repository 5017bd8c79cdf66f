"""tools/bench/torch_account.py: the PyTorch peer's profiler events made into the kernel account's schema."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "bench"))
import torch_account as ta  # noqa: E402

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
LN = "triton_per_fused_native_layer_norm_0"

# Two profiled steps of 1000 us each (steps 4 and 5), in microseconds: a GEMM in the forward and the backward of
# each, a layer norm, flash attention, the fused AdamW, and a copy that overlaps the GEMM on another stream.
KERNELS = []
for t0 in (0, 1000):
    KERNELS += [(GEMM, t0 + 10, 100, "forward"), (LN, t0 + 120, 30, "forward"),
                ("flash_fwd_kernel", t0 + 150, 50, "forward"),
                ("Memcpy HtoD (Pinned -> Device)", t0 + 50, 100, "forward"),
                (GEMM, t0 + 300, 200, "backward"),
                ("multi_tensor_apply_kernel<FusedAdamMathFunctor>", t0 + 600, 100, "optimizer")]


class Family(unittest.TestCase):
    def test_names(self):
        cases = {GEMM: "matmul", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN": "matmul",
                 "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>": "matmul",
                 "triton_tem_fused_mm_3": "matmul", "flash_fwd_kernel": "attention",
                 "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention", LN: "layernorm",
                 "triton_red_fused_native_layer_norm_native_layer_norm_backward_7": "layernorm",
                 "triton_red_fused__log_softmax_9": "classifier",
                 "nll_loss_forward_reduce_cuda_kernel_2d": "classifier", "triton_poi_fused_add_embedding_1": "encoder",
                 "multi_tensor_apply_kernel<FusedAdamMathFunctor>": "adamw",
                 "Memset (Device)": "copy", "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "nccl",
                 "triton_poi_fused_gelu_5": "other", "triton_poi_fused_comm_8": "other"}
        for name, fam in cases.items():
            self.assertEqual(ta.family(name), fam, name)


class Pieces(unittest.TestCase):
    def test_phase_at_takes_the_innermost_range(self):
        ranges = [("forward", 0, 100), ("backward", 100, 300), ("optimizer", 150, 200)]
        self.assertEqual(ta.phase_at(50, ranges), "forward")
        self.assertEqual(ta.phase_at(160, ranges), "optimizer")
        self.assertEqual(ta.phase_at(250, ranges), "backward")
        self.assertEqual(ta.phase_at(400, ranges), "other")

    def test_busy_is_the_union(self):
        self.assertEqual(ta.busy_us([(0, 10), (5, 10), (30, 5), (31, 1)]), 20)

    def test_gemm_flops_go_to_the_gemm_kernels(self):
        f = ta.gemm_flops([(6e9, [(GEMM, 40.0), ("cublasLt::splitKreduce_kernel", 3.0)], "forward"),
                           (6e9, [("cublasLt::splitKreduce_kernel", 2.0), (GEMM, 41.0)], "forward"),
                           (2e9, [("oddly_named", 1.0)], "backward"), (1e9, [], "forward")])
        self.assertEqual(f, {(GEMM, "forward"): [12e9, 2], ("oddly_named", "backward"): [2e9, 1]})

    def test_peak(self):
        self.assertEqual(ta.peak("NVIDIA H200")["flops"], 989e12)
        self.assertEqual(ta.peak("NVIDIA H100 PCIe")["flops"], 756e12)
        self.assertIsNone(ta.peak("NVIDIA GeForce RTX 4090")["flops"])


class Account(unittest.TestCase):
    def setUp(self):
        # Forward GEMMs: 2 launches with FLOPs; backward: one of its two launches only, so its FLOPs are unknown.
        flops = {(GEMM, "forward"): [2 * 5e10, 2], (GEMM, "backward"): [1e11, 1]}
        self.doc = ta.account(KERNELS, wall_s=0.002, steps=2, first_step=4, device="NVIDIA H100 80GB HBM3",
                              flops=flops)
        self.ops = {(o["name"], o["phase"]): o for o in self.doc["operations"]}

    def test_document(self):
        d = self.doc
        self.assertEqual((d["device"], d["emulated"], d["times"], d["steps"]),
                         ("NVIDIA H100 80GB HBM3", False, "measured", [4, 5]))
        self.assertAlmostEqual(d["step_time_s"], 2e-3)  # totals over the two steps
        # In each step the copy (50-150) overlaps the GEMM (10-110) and the layer norm (120-150): 10-200, 300-500,
        # 600-700.
        self.assertAlmostEqual(d["busy_s"], 980e-6)
        self.assertAlmostEqual(d["unaccounted_s"], 1020e-6)
        self.assertAlmostEqual(d["unaccounted_share"], 0.51)
        self.assertEqual(d["peak"]["flops"], 989e12)
        self.assertEqual(len(d["operations"]), 6)
        times = [o["time_s"] for o in d["operations"]]
        self.assertEqual(times, sorted(times, reverse=True))
        keys = {"name", "family", "phase", "shape", "calls", "launches", "time_s", "flops", "ideal_bytes", "tflops",
                "gbps", "roofline_fraction", "bound", "kernels"}
        for o in d["operations"]:
            self.assertEqual(set(o), keys)

    def test_operations(self):
        fwd, bwd = self.ops[(GEMM, "forward")], self.ops[(GEMM, "backward")]
        self.assertEqual((fwd["family"], fwd["launches"], fwd["calls"]), ("matmul", 2, 2))
        self.assertAlmostEqual(fwd["time_s"], 200e-6)
        self.assertEqual(fwd["flops"], 1e11)
        self.assertAlmostEqual(fwd["tflops"], 500)
        self.assertAlmostEqual(fwd["roofline_fraction"], 500 / 989)
        self.assertEqual(fwd["bound"], "compute")
        self.assertEqual(fwd["kernels"], [{"name": GEMM, "launches": 2, "time_s": fwd["time_s"]}])
        self.assertIsNone(bwd["flops"])
        self.assertIsNone(bwd["roofline_fraction"])
        ln = self.ops[(LN, "forward")]
        self.assertEqual((ln["family"], ln["flops"], ln["ideal_bytes"], ln["gbps"]), ("layernorm", None, None, None))
        self.assertEqual(self.ops[("multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer")]["family"], "adamw")

    def test_table(self):
        lines = ta.table(self.doc, limit=3)
        self.assertIn("unaccounted 0.51 ms (51.0%)", lines[0])
        self.assertEqual(len(lines), 2 + 3 + 1)
        self.assertIn("backward", lines[2])
        self.assertIn("(3 more operations)", lines[-1])


if __name__ == "__main__":
    unittest.main()
