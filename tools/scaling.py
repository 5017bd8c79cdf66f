"""Strong- and weak-scaling table and plots from a sweep's run directories.

    /usr/bin/python3 tools/scaling.py SWEEP_DIR [-o OUT_DIR] [--skip N]
    /usr/bin/python3 tools/scaling.py RUN_DIR [RUN_DIR ...] [-o OUT_DIR] [--skip N] [--mode strong|weak]

SWEEP_DIR is what jobs/sweep writes: manifest.tsv (mode, ranks, nodes, global_batch, micro_batch, steps, run_dir,
job_id) and one run directory per point. Run directories can also be given directly: the ranks then come from
run.dir/jobs.tsv (written by jobs/train.sbatch) or from the "parallel: N ranks" line of run.dir/job-*.log, the
batch from run.dir/config.ini, and the mode from --mode, else from the directory name (strong-*/weak-*), else
strong.

Per run: the training lines of metrics.jsonl (a resumed run rewrites the steps after its checkpoint, so the last
line of a step wins), leaving out the first --skip steps (default 2: step 1 pays for first-touch allocation,
thread start-up and the first collectives; step 2 still shows some of it) -- and never the last one when that
would leave nothing. step time = mean step_s over the kept steps; tokens/s = global_batch x seq_len / step
time; comm share = mean comm_s / mean step_s.

Scaling, against the run with the fewest ranks of the same series (mode):
    speed-up   = tokens/s(N) / tokens/s(N0)
    efficiency = speed-up / (N / N0)
Strong scaling (fixed global batch): ideal speed-up is N / N0, i.e. the step time falls as 1/N.
Weak scaling (fixed per-rank batch, global batch grows with N): ideal is a constant step time, so the
efficiency is step_time(N0) / step_time(N), and the speed-up is the scaled (Gustafson) speed-up.

Writes OUT_DIR (default: SWEEP_DIR, or the current directory) /scaling.md, scaling.csv and, per series present,
strong_scaling.png / weak_scaling.png (tokens/s against ranks with the ideal line, and efficiency), using
matplotlib's Agg backend (Debian python3-matplotlib).
"""
import argparse
import configparser
import csv
import glob
import math
import os
import re
import statistics
import sys

from run_metrics import read_metrics


def read_manifest(sweep):
    path = os.path.join(sweep, "manifest.tsv")
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        sys.exit(f"{path}: no runs")
    runs = []
    for r in rows:
        d = r["run_dir"]
        if not os.path.isabs(d) and not os.path.isdir(d):
            # relative to the repository root the sweep ran from; try next to the manifest too
            cand = os.path.join(sweep, os.path.basename(d))
            d = cand if os.path.isdir(cand) else d
        runs.append({"mode": r["mode"], "ranks": int(r["ranks"]), "nodes": int(r["nodes"]), "dir": d,
                     "job_id": r.get("job_id", "-")})
    return runs


def ranks_of(run_dir):
    """Ranks of a run without a manifest: jobs.tsv (column 7) or the 'parallel: N ranks' log line."""
    tsv = os.path.join(run_dir, "jobs.tsv")
    if os.path.exists(tsv):
        with open(tsv) as f:
            lines = [l.rstrip("\n").split("\t") for l in f if l.strip()]
        if lines and len(lines[-1]) >= 8:
            return int(lines[-1][6]), int(lines[-1][7])
    for log in sorted(glob.glob(os.path.join(run_dir, "job-*.log"))):
        with open(log, errors="replace") as f:
            m = re.search(r"parallel: (\d+) ranks", f.read())
        if m:
            return int(m.group(1)), 1
    sys.exit(f"{run_dir}: cannot tell the rank count (no jobs.tsv or job-*.log); use a sweep manifest")


def read_config(run_dir):
    cfg = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    path = os.path.join(run_dir, "config.ini")
    if not cfg.read(path):
        sys.exit(f"{path}: missing (the run did not start?)")
    return {"global_batch": cfg.getint("train", "global_batch"), "micro_batch": cfg.getint("train", "micro_batch"),
            "seq_len": cfg.getint("model", "seq_len")}


def read_steps(run_dir):
    steps = [r for r in read_metrics(run_dir)[0] if "loss" in r and "step_s" in r]
    if not steps:
        sys.exit(f"{os.path.join(run_dir, 'metrics.jsonl')}: no training steps")
    return steps


def measure(run, skip):
    cfg = read_config(run["dir"])
    steps = read_steps(run["dir"])
    kept = [s for s in steps if s["step"] > skip] or steps[-1:]
    step_s = [s["step_s"] for s in kept]
    mean = statistics.fmean(step_s)
    tokens_per_step = cfg["global_batch"] * cfg["seq_len"]
    accum = cfg["global_batch"] // (run["ranks"] * cfg["micro_batch"])
    comm = statistics.fmean(s.get("comm_s", 0.0) for s in kept)
    mfu = statistics.fmean(s.get("mfu", 0.0) for s in kept)
    return dict(run, **cfg, accum=accum, steps=len(steps), averaged=len(kept), first=kept[0]["step"],
                step_s=mean, step_sd=statistics.stdev(step_s) if len(step_s) > 1 else 0.0,
                tokens_per_s=tokens_per_step / mean, comm_share=comm / mean if mean > 0 else 0.0, mfu=mfu)


def add_scaling(rows):
    by_mode = {}
    for r in rows:
        by_mode.setdefault(r["mode"], []).append(r)
    for mode, rs in by_mode.items():
        rs.sort(key=lambda r: (r["ranks"], r["nodes"]))
        base = rs[0]
        for r in rs:
            r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["efficiency"] = r["speedup"] / (r["ranks"] / base["ranks"])
    return by_mode


COLS = [("mode", "mode", "{}"), ("ranks", "ranks", "{}"), ("nodes", "nodes", "{}"),
        ("global_batch", "global batch", "{}"), ("micro_batch", "micro-batch", "{}"), ("accum", "accum", "{}"),
        ("averaged", "steps averaged", "{}"), ("step_s", "step time (s)", "{:.4f}"), ("step_sd", "± sd", "{:.4f}"),
        ("tokens_per_s", "tokens/s", "{:.0f}"), ("per_rank", "tokens/s per rank", "{:.0f}"),
        ("speedup", "speed-up", "{:.2f}"), ("efficiency", "efficiency", "{:.1%}"),
        ("comm_share", "comm share", "{:.1%}"), ("mfu", "MFU", "{:.1%}")]


def write_tables(by_mode, out, skip):
    rows = [r for mode in ("strong", "weak") for r in by_mode.get(mode, [])]
    rows += [r for mode, rs in by_mode.items() if mode not in ("strong", "weak") for r in rs]
    for r in rows:
        r["per_rank"] = r["tokens_per_s"] / r["ranks"]
    with open(os.path.join(out, "scaling.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([k for k, _, _ in COLS] + ["run_dir"])
        for r in rows:
            w.writerow([f"{r[k]:.6g}" if isinstance(r[k], float) else r[k] for k, _, _ in COLS] + [r["dir"]])
    lines = [f"# Scaling: {len(rows)} runs", "",
             f"Step time is the mean `step_s` of each run's steps after step {skip} (warm-up left out); "
             "tokens/s = global batch × seq_len / step time. Speed-up and efficiency are against the run with "
             "the fewest ranks of the same series: efficiency = speed-up / (N / N0). Strong scaling keeps the "
             "global batch fixed (ideal: step time ∝ 1/N); weak scaling keeps the per-rank batch fixed (ideal: "
             "constant step time).", ""]
    lines.append("| " + " | ".join(h for _, h, _ in COLS) + " |")
    lines.append("|" + "---|" * len(COLS))
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLS) + " |")
    lines.append("")
    with open(os.path.join(out, "scaling.md"), "w") as f:
        f.write("\n".join(lines))
    return "\n".join(lines)


def plot(mode, rs, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ranks = [r["ranks"] for r in rs]
    tps = [r["tokens_per_s"] for r in rs]
    eff = [100 * r["efficiency"] for r in rs]
    base = rs[0]
    ideal = [base["tokens_per_s"] * n / base["ranks"] for n in ranks]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    what = "fixed global batch" if mode == "strong" else "fixed per-rank batch" if mode == "weak" else mode
    fig.suptitle(f"{mode} scaling ({what})")
    a.plot(ranks, tps, "o-", label="measured")
    a.plot(ranks, ideal, "--", color="gray", label="ideal (linear)")
    a.set_xscale("log", base=2)
    a.set_yscale("log", base=2)
    a.set_xticks(ranks, [str(n) for n in ranks])
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}")
    a.yaxis.set_major_formatter(plain)
    a.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a.set_xlabel("ranks")
    a.set_ylabel("tokens/s")
    a.grid(True, which="both", alpha=0.3)
    a.legend()
    b.plot(ranks, eff, "o-")
    b.axhline(100, ls="--", color="gray")
    b.set_xscale("log", base=2)
    b.set_xticks(ranks, [str(n) for n in ranks])
    b.set_xlabel("ranks")
    b.set_ylabel("parallel efficiency (%)")
    b.set_ylim(0, max(110, max(eff) * 1.1))
    for n, e in zip(ranks, eff):
        b.annotate(f"{e:.0f}%", (n, e), textcoords="offset points", xytext=(0, 6), ha="center")
    b.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, f"{mode}_scaling.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="a sweep directory (with manifest.tsv) or run directories")
    ap.add_argument("-o", "--out", help="output directory (default: the sweep directory, else .)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the averages (default 2)")
    ap.add_argument("--mode", choices=["strong", "weak"], help="series of run directories given directly")
    args = ap.parse_args()

    if len(args.dirs) == 1 and os.path.exists(os.path.join(args.dirs[0], "manifest.tsv")):
        runs = read_manifest(args.dirs[0])
        out = args.out or args.dirs[0]
    else:
        runs = []
        for d in args.dirs:
            ranks, nodes = ranks_of(d)
            base = os.path.basename(os.path.normpath(d))
            mode = args.mode or ("weak" if base.startswith("weak") else "strong")
            runs.append({"mode": mode, "ranks": ranks, "nodes": nodes, "dir": d, "job_id": "-"})
        out = args.out or "."
    os.makedirs(out, exist_ok=True)
    rows = [measure(r, args.skip) for r in runs]
    for r in rows:
        if not (r["step_s"] > 0 and math.isfinite(r["step_s"])):
            sys.exit(f"{r['dir']}: bad step time {r['step_s']}")
    by_mode = add_scaling(rows)
    print(write_tables(by_mode, out, args.skip))
    for mode, rs in by_mode.items():
        print(f"wrote {plot(mode, rs, out)}")
    print(f"wrote {os.path.join(out, 'scaling.md')} and {os.path.join(out, 'scaling.csv')}")


if __name__ == "__main__":
    main()
