"""Compares two yuanlm runs: per-step losses (relative) and the weights of their newest checkpoints
(max |a-b| / max |a| over all of them; 0 means bit-identical).

usage: compare_runs.py RUN_A RUN_B LOSS_RTOL PARAM_RTOL
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from safetensors_f32 import read_f32  # noqa: E402

YUANLM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bin", "yuanlm")


def losses(run):
    with open(f"{run}/metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    for kind in ("loss", "val_loss"):  # a resumed run rewrites what came after its checkpoint, never twice
        steps = [r["step"] for r in records if kind in r]
        assert len(steps) == len(set(steps)), f"{run}/metrics.jsonl: a step has two {kind} records: {steps}"
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def weights(run):
    """The fp32 weights of the newest checkpoint, flat: `yuanlm export` puts the optimizer shards of any parallel
    layout back together (tensor-parallel parts included), as one process."""
    with open(f"{run}/ckpt/latest") as f:
        ckpt = f"{run}/ckpt/{f.read().strip()}"
    with open(f"{ckpt}/state.json") as f:
        step = json.load(f)["step"]
    out = tempfile.mkdtemp()
    try:
        subprocess.run([YUANLM, "export", "--checkpoint", ckpt, "--out", out], check=True, capture_output=True)
        tensors, _ = read_f32(f"{out}/model.safetensors")
    finally:
        shutil.rmtree(out)
    return step, np.concatenate([tensors[name].ravel() for name in sorted(tensors)])


a, b, loss_tol, param_tol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
la, lb = losses(a), losses(b)
assert len(la) == len(lb) and len(la) > 0, f"{a}: {len(la)} steps, {b}: {len(lb)} steps"
assert all(x[0] == y[0] for x, y in zip(la, lb)), "step numbers differ"
worst = max(abs(x[1] - y[1]) / abs(x[1]) for x, y in zip(la, lb))
print(f"losses: {len(la)} steps, worst relative difference {worst:.2e} (tolerance {loss_tol:g})")
assert worst <= loss_tol, f"losses differ: {la} vs {lb}"
(sa, wa), (sb, wb) = weights(a), weights(b)
assert sa == sb and wa.shape == wb.shape, f"checkpoints at steps {sa} and {sb}"
worst_p = np.abs(wa - wb).max() / np.abs(wa).max()
print(f"weights at step {sa}: {wa.size} values, worst relative difference {worst_p:.2e} (tolerance {param_tol:g})")
assert worst_p <= param_tol, "weights differ"
