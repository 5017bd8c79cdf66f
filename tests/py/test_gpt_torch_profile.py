"""tools/bench/gpt_torch.py's account on the CPU: the real torch.profiler over the peer's training step (its
phase ranges, clipping, AdamW) with a tiny model, so that the event fields the account reads are checked where
there is no GPU. Only the kernels themselves need one: on the CPU the profiler records none. Skipped without
PyTorch."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "bench"))
try:
    import torch
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "no PyTorch")
class ProfileOnTheCpu(unittest.TestCase):
    def test_phases_flops_and_the_document(self):
        import gpt_torch
        import torch_account
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=1e-3)
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        step = gpt_torch.make_step(lambda: torch.nn.functional.cross_entropy(model(x).float(), y), params, opt, "cpu")
        step()
        events, wall = gpt_torch.profile(step, 2, cuda=False)
        self.assertGreater(wall, 0)

        host, device = gpt_torch.phase_ranges(events)
        self.assertEqual(device, [])
        self.assertEqual(sorted(p for p, _, _ in host), ["backward"] * 2 + ["forward"] * 2 + ["optimizer"] * 2)
        for _, start, end in host:
            self.assertLess(start, end)
        # The forward's GEMMs (aten::addmm under autocast) carry FLOPs and lie in a forward range.
        gemms = [e for e in events if e.name in torch_account.GEMM_OPS and e.flops]
        self.assertTrue(gemms)
        self.assertIn(2 * 8 * 16 * 32, [e.flops for e in gemms])
        self.assertIn("forward", [torch_account.phase_at(e.time_range.start, host) for e in gemms])
        for e in gemms:
            self.assertEqual(e.kernels, [])  # kernels are the GPU's

        kernels, flops = gpt_torch.profiled_kernels(events)
        self.assertEqual((kernels, flops), ([], {}))
        doc = torch_account.account(kernels, wall_s=wall, steps=2, first_step=2, device="cpu", flops=flops)
        self.assertEqual((doc["steps"], doc["busy_s"], doc["operations"]), ([2, 3], 0.0, []))
        self.assertAlmostEqual(doc["unaccounted_share"], 1.0)


if __name__ == "__main__":
    unittest.main()
