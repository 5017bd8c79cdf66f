"""tools/kernel_account.py: two kernel accounts side by side by family."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, TOOLS)
import kernel_account as ka  # noqa: E402


def op(name, family, time_s, flops=None, ideal_bytes=None, roofline=None, phase="forward"):
    return {"name": name, "family": family, "phase": phase, "shape": "", "calls": 1, "launches": 1, "time_s": time_s,
            "flops": flops, "ideal_bytes": ideal_bytes, "tflops": None, "gbps": None, "roofline_fraction": roofline,
            "bound": None, "kernels": []}


# Accounts hold totals over their steps. The trainer's: two steps of 10 ms, 8 ms of kernels each; GEMMs 5 ms a step
# at 500 TFLOP/s (roofline 0.5, then 0.8 for 1 ms); layer norms 2 ms moving 4 GB/ms, one of them without bytes.
OURS = {"device": "NVIDIA H100 80GB HBM3", "emulated": False, "times": "measured", "steps": [3, 4],
        "step_time_s": 0.020, "busy_s": 0.016, "unaccounted_s": 0.004, "unaccounted_share": 0.2,
        "peak": {"flops": 989e12, "bytes_per_s": 3.35e12, "source": "datasheet"},
        "operations": [op("gemm_a", "matmul", 0.008, flops=4e12, roofline=0.5),
                       op("gemm_b", "matmul", 0.002, flops=1e12, roofline=0.8, phase="backward"),
                       op("ln", "layernorm", 0.002, ideal_bytes=8e9), op("ln_bwd", "layernorm", 0.002),
                       op("adamw", "adamw", 0.002, ideal_bytes=4e9, phase="optimizer")]}
# The peer's: one step of 8 ms; GEMMs 6 ms, FLOPs known for 4 ms of them; attention 1 ms; no layer norm.
PEER = {"device": "NVIDIA H100 80GB HBM3", "emulated": False, "times": "measured", "steps": [4, 4],
        "step_time_s": 0.008, "busy_s": 0.007, "unaccounted_s": 0.001, "unaccounted_share": 0.125,
        "peak": {"flops": 989e12, "bytes_per_s": 3.35e12, "source": "datasheet"},
        "operations": [op("sm90_xmma_gemm", "matmul", 0.004, flops=1.6e12, roofline=0.4),
                       op("cublasLt::splitKreduce_kernel", "matmul", 0.002),
                       op("flash_fwd_kernel", "attention", 0.001)]}


class Families(unittest.TestCase):
    def test_rows(self):
        t, share, gbps, tflops, roof = ka.row(OURS, "matmul")
        self.assertAlmostEqual(t, 5.0)
        self.assertAlmostEqual(share, 0.5)
        self.assertIsNone(gbps)
        self.assertAlmostEqual(tflops, 500)
        self.assertAlmostEqual(roof, (0.5 * 4 + 0.8 * 1) / 5)
        t, share, gbps, tflops, roof = ka.row(OURS, "layernorm")
        self.assertAlmostEqual(t, 2.0)
        self.assertAlmostEqual(gbps, 4000)  # the one with bytes: 4 GB in 1 ms
        self.assertEqual((tflops, roof), (None, None))
        # The peer's GEMM rate counts the 4 ms whose FLOPs it knows.
        self.assertAlmostEqual(ka.row(PEER, "matmul")[3], 400)
        self.assertAlmostEqual(ka.row(PEER, "matmul")[1], 0.75)
        self.assertEqual(ka.row(PEER, "layernorm"), (None,) * 5)

    def test_render(self):
        lines = ka.render([OURS, PEER], ["A", "B"])
        self.assertTrue(lines[0].startswith("A: NVIDIA H100 80GB HBM3, steps 3-4, peak 989 TFLOP/s"))
        self.assertTrue(lines[1].startswith("B: NVIDIA H100 80GB HBM3, steps 4-4"))
        body = lines[4:]
        # Families by the longer of the two times: matmul (6 ms), layernorm (2), then adamw and attention (1).
        self.assertEqual([ln.split()[0] for ln in body[:4]], ["matmul", "layernorm", "adamw", "attention"])
        self.assertEqual(body[0].split(), ["matmul", "5.00", "50.0%", "-", "500.0", "0.56",
                                           "6.00", "75.0%", "-", "400.0", "0.40"])
        self.assertEqual(body[1].split(), ["layernorm", "2.00", "20.0%", "4000", "-", "-"] + ["-"] * 5)
        rows = {ln.split()[0]: ln.split()[1:] for ln in body[:-1]}
        self.assertEqual(rows["unaccounted"], ["2.00", "20.0%", "-", "-", "-", "1.00", "12.5%", "-", "-", "-"])
        self.assertEqual(rows["step"][:2] + rows["step"][5:7], ["10.00", "100.0%", "8.00", "100.0%"])
        self.assertEqual(lines[-1], "step time A / B: 1.25")

    def test_one_account_and_an_emulated_one(self):
        emulated = dict(OURS, emulated=True, times="meaningless: emulated device")
        lines = ka.render([emulated], ["A"])
        self.assertIn("EMULATED", lines[0])
        self.assertFalse(any(ln.startswith("step time") for ln in lines))

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            paths = [os.path.join(d, n) for n in ("ours.json", "peer.json")]
            for p, doc in zip(paths, (OURS, PEER)):
                with open(p, "w") as f:
                    json.dump(doc, f)
            out = subprocess.run([sys.executable, os.path.join(TOOLS, "kernel_account.py")] + paths,
                                 capture_output=True, text=True, check=True).stdout
        self.assertTrue(out.startswith(f"A is {paths[0]}\nB is {paths[1]}\nA: NVIDIA"))
        self.assertIn("step time A / B: 1.25", out)


if __name__ == "__main__":
    unittest.main()
