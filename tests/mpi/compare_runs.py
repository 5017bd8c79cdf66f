"""Compares two yuanlm runs: per-step losses (relative) and final weights (max |a-b| / max |a| per tensor).

usage: compare_runs.py RUN_A RUN_B LOSS_RTOL PARAM_RTOL
"""
import json
import struct
import sys

import numpy as np


def losses(run):
    with open(f"{run}/metrics.jsonl") as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


def weights(run):
    with open(f"{run}/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items()}


a, b, loss_tol, param_tol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
la, lb = losses(a), losses(b)
assert len(la) == len(lb) and len(la) > 0, f"{a}: {len(la)} steps, {b}: {len(lb)} steps"
worst = max(abs(x[1] - y[1]) / abs(x[1]) for x, y in zip(la, lb))
print(f"losses: {len(la)} steps, worst relative difference {worst:.2e} (tolerance {loss_tol:g})")
assert all(x[0] == y[0] for x, y in zip(la, lb)), "step numbers differ"
assert worst <= loss_tol, f"losses differ: {la} vs {lb}"
wa, wb = weights(a), weights(b)
assert wa.keys() == wb.keys(), "tensor names differ"
worst_p, name = max((np.abs(wa[k] - wb[k]).max() / max(np.abs(wa[k]).max(), 1e-12), k) for k in wa)
print(f"weights: {len(wa)} tensors, worst relative difference {worst_p:.2e} in {name} (tolerance {param_tol:g})")
assert worst_p <= param_tol, f"weights differ in {name}"
