"""Reads a yuanlm run's metrics.jsonl (written by rank 0, one JSON object per line): shared by plot_metrics.py
and scaling.py."""
import json
import os
import sys


def read_metrics(run_dir):
    """(steps, vals): the training-step records and the evaluation records, each in step order. A resumed run
    rewrites the steps after its checkpoint, so a later record of a step replaces an earlier one."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{path}: missing (the run did not start?)")
    steps, vals = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            (vals if "val_loss" in rec else steps)[rec["step"]] = rec
    if not steps and not vals:
        sys.exit(f"{path}: no metrics")
    return [steps[s] for s in sorted(steps)], [vals[s] for s in sorted(vals)]
