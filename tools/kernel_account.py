"""One or two kernel accounts (the trainer's run.dir/kernels.json from --profile.kernels, the PyTorch peer's
kernels_torch_<config>.json from tools/bench/gpt_torch.py --account) side by side by family: each family's time
per step, its share of the step, and the rates of the operations that know their bytes (GB/s) and FLOPs
(TFLOP/s, roofline fraction); then the step, the kernels' busy time, the unaccounted rest, and the ratio of the
step times.

    /usr/bin/python3 tools/kernel_account.py A.json [B.json]

A family's rates count only its operations that have the figure (the peer's profiler gives FLOPs for GEMMs
alone, and bytes for none), so a rate stands for part of a family's time: "-" where no operation has it. Its
roofline fraction is the time-weighted mean of its operations'.
"""
import json
import sys


def steps(doc):
    """The number of profiled steps: an account's times, FLOPs and bytes are totals over them."""
    return doc["steps"][1] - doc["steps"][0] + 1


def families(doc):
    """{family: {"time_s", "bytes", "bytes_time_s", "flops", "flops_time_s", "roofline_time_s", "rated_time_s"}}
    summed over the account's operations (totals over its steps)."""
    out = {}
    for op in doc["operations"]:
        f = out.setdefault(op["family"], dict.fromkeys(
            ("time_s", "bytes", "bytes_time_s", "flops", "flops_time_s", "roofline_time_s", "rated_time_s"), 0.0))
        t = op["time_s"]
        f["time_s"] += t
        if op.get("ideal_bytes") is not None:
            f["bytes"] += op["ideal_bytes"]
            f["bytes_time_s"] += t
        if op.get("flops") is not None:
            f["flops"] += op["flops"]
            f["flops_time_s"] += t
        if op.get("roofline_fraction") is not None:
            f["roofline_time_s"] += op["roofline_fraction"] * t
            f["rated_time_s"] += t
    return out


def row(doc, fam):
    """(time ms per step, share of the step, GB/s, TFLOP/s, roofline fraction) of one family, None where
    unknown."""
    f = families(doc).get(fam)
    if f is None:
        return (None,) * 5
    step = doc["step_time_s"]
    return (f["time_s"] / steps(doc) * 1e3,
            f["time_s"] / step if step else None,
            f["bytes"] / f["bytes_time_s"] / 1e9 if f["bytes_time_s"] else None,
            f["flops"] / f["flops_time_s"] / 1e12 if f["flops_time_s"] else None,
            f["roofline_time_s"] / f["rated_time_s"] if f["rated_time_s"] else None)


FORMATS = ("{:.2f}", "{:.1%}", "{:.0f}", "{:.1f}", "{:.2f}")
HEADS = ("ms", "share", "GB/s", "TFLOP/s", "roofline")
WIDTHS = (9, 7, 7, 8, 9)


def cells(values):
    return "".join(f"{('-' if v is None else fmt.format(v)):>{w}}" for v, fmt, w in zip(values, FORMATS, WIDTHS))


def render(docs, labels):
    """The side-by-side table of one or two accounts, as lines of text."""
    lines = []
    for label, doc in zip(labels, docs):
        s = doc["steps"]
        note = "; EMULATED: its times mean nothing, its FLOPs and bytes do" if doc.get("emulated") else ""
        pk = doc["peak"]
        peak = f"{pk['flops'] / 1e12:.0f} TFLOP/s" if pk.get("flops") else "unknown"
        lines.append(f"{label}: {doc['device']}, steps {s[0]}-{s[1]}, peak {peak} ({pk.get('source', '')}){note}")
    totals = {}
    for doc in docs:
        for fam, f in families(doc).items():
            totals[fam] = max(totals.get(fam, 0.0), f["time_s"])
    order = sorted(totals, key=lambda fam: -totals[fam])
    width = sum(WIDTHS)
    lines.append((f"{'':<12}" + "".join(f"{label:^{width}}" for label in labels)).rstrip())
    lines.append(f"{'family':<12}" + "".join(f"{h:>{w}}" for _ in docs for h, w in zip(HEADS, WIDTHS)))
    for fam in order:
        lines.append(f"{fam:<12}" + "".join(cells(row(doc, fam)) for doc in docs))
    for name, key in (("busy", "busy_s"), ("unaccounted", "unaccounted_s"), ("step", "step_time_s")):
        lines.append(f"{name:<12}" + "".join(
            cells((d[key] / steps(d) * 1e3, d[key] / d["step_time_s"] if d["step_time_s"] else None, None, None,
                   None))
            for d in docs))
    if len(docs) == 2 and docs[1]["step_time_s"]:
        per_step = [d["step_time_s"] / steps(d) for d in docs]
        lines.append(f"step time {labels[0]} / {labels[1]}: {per_step[0] / per_step[1]:.2f}")
    return lines


def main(argv):
    if not 1 <= len(argv) <= 2:
        sys.exit(__doc__)
    docs = []
    for path in argv:
        with open(path) as f:
            docs.append(json.load(f))
    labels = ["A", "B"][:len(docs)]
    for label, path in zip(labels, argv):
        print(f"{label} is {path}")
    print("\n".join(render(docs, labels)))


if __name__ == "__main__":
    main(sys.argv[1:])
