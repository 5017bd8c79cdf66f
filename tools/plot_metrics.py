"""Plots the metrics.jsonl of one or more `yuanlm train` runs into one PNG.

    /usr/bin/python3 tools/plot_metrics.py RUN_DIR [RUN_DIR ...] -o out.png [--logx] [--x step|tokens]

Three panels: training loss per step with the val_loss evaluations as points, throughput (tokens/s), and the
mean time per step split into data wait / compute / gradient communication / optimizer / the rest of
step_s, one bar per run. Runs
are labelled by their directory name. A resumed run rewrites the steps after its checkpoint, so when a step
appears twice the later line wins. The first step of a run pays for warm-up and is left out of the time split.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from run_metrics import read_metrics  # noqa: E402

PHASES = [("data_s", "data"), ("compute_s", "compute"), ("comm_s", "comm"), ("optim_s", "optim")]


def labels(run_dirs):
    """Directory names, or the paths as given when two runs share a name."""
    names = [os.path.basename(os.path.normpath(r)) or r for r in run_dirs]
    return names if len(set(names)) == len(names) else list(run_dirs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--x", choices=["step", "tokens"], default="step", help="x axis of the loss and throughput")
    ap.add_argument("--logx", action="store_true", help="logarithmic x axis (the step-0 evaluation is not shown)")
    a = ap.parse_args()

    fig, (ax_loss, ax_tps, ax_time) = plt.subplots(1, 3, figsize=(16, 4.8))
    tokens_per_step = {}
    split = []
    for i, (run, name) in enumerate(zip(a.runs, labels(a.runs))):
        steps, vals = read_metrics(run)
        color = f"C{i % 10}"
        if steps:
            # tokens is cumulative, so every step has the same token count: the last line tells it
            tokens_per_step[run] = steps[-1]["tokens"] / steps[-1]["step"]
        scale = tokens_per_step.get(run, 1.0) if a.x == "tokens" else 1.0
        xs = [r["step"] * scale for r in steps]
        ax_loss.plot(xs, [r["loss"] for r in steps], color=color, lw=1.2, label=f"{name} loss")
        if vals:
            ax_loss.plot([r["step"] * scale for r in vals], [r["val_loss"] for r in vals], "o", color=color,
                         mec="black", ms=5, label=f"{name} val_loss")
        ax_tps.plot(xs, [r["tokens_per_s"] for r in steps], color=color, lw=1.2, label=name)
        timed = steps[1:] or steps
        mean = lambda k: sum(r.get(k) or 0.0 for r in timed) / max(1, len(timed))
        phases = [mean(k) for k, _ in PHASES]
        split.append((name, phases + [max(0.0, mean("step_s") - sum(phases))]))

    xlabel = "tokens" if a.x == "tokens" else "step"
    for ax, title in [(ax_loss, "loss"), (ax_tps, "throughput (tokens/s)")]:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if a.logx:
            ax.set_xscale("log")
    ax_loss.legend(fontsize=8)
    ax_tps.legend(fontsize=8)
    ax_tps.set_ylim(bottom=0)

    names = [n for n, _ in split]
    bottom = [0.0] * len(split)
    for j, phase in enumerate([p for _, p in PHASES] + ["other"]):
        ms = [1000 * s[j] for _, s in split]
        ax_time.bar(names, ms, bottom=bottom, label=phase, color=f"C{j}")
        bottom = [b + m for b, m in zip(bottom, ms)]
    ax_time.set_title("mean time per step (ms), first step excluded")
    ax_time.set_ylabel("ms")
    ax_time.legend(fontsize=8)
    ax_time.tick_params(axis="x", labelrotation=20)

    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print(f"wrote {a.out}: {len(a.runs)} run(s)")


if __name__ == "__main__":
    main()
