"""The PyTorch peer's kernel account (tools/bench/gpt_torch.py --account) in the schema of the trainer's
run.dir/kernels.json (--profile.kernels), from the kernels torch.profiler saw: pure functions, no torch, so that
tests/py can check them without a GPU or PyTorch.

Inductor fuses the model's operations into kernels of its own, so the account has one operation per kernel name
and phase: its name is the kernel's, its family guessed from the name (FAMILIES), its phase the record_function
range (forward, backward, optimizer) the kernel ran in. The profiler gives FLOPs only for the aten GEMMs
(with_flops); every other figure it cannot know (bytes, shapes) is null.
"""
import re

# (family, pattern searched in the kernel name, case-insensitive); the first match wins, so the fused and
# wrapped names come before the patterns their parts would match: cuDNN's and cutlass's attention before the
# GEMMs, inductor's log_softmax fusions before its layer norms.
FAMILIES = [
    ("copy", r"^memcpy|^memset"),
    ("nccl", r"nccl"),
    ("attention", r"flash|fmha|sdpa|attention"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|(^|_)(add|b)?mm(_|$)"),
    ("adamw", r"adam"),
    ("classifier", r"cross_entropy|log_softmax|nll_loss"),
    ("layernorm", r"layer_norm|layernorm|gammabeta"),
    ("encoder", r"embedding|index_select|indexselect"),
]
# The aten operations whose FLOPs the profiler counts and whose kernels are GEMMs.
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
PHASES = ("forward", "backward", "optimizer")

# Datasheet figures, dense bf16 and HBM, as cuda_peak_flops (cuda/device.cu) names the parts: the PCIe and NVL
# parts before the SXM ones whose names they contain.
PEAKS = [("H100 PCIe", 756e12, 2.0e12), ("H100 NVL", 835e12, 3.9e12), ("H200 NVL", 835e12, 4.8e12),
         ("H100", 989e12, 3.35e12), ("H200", 989e12, 4.8e12), ("A100", 312e12, 2.0e12)]


def family(kernel):
    for fam, pattern in FAMILIES:
        if re.search(pattern, kernel, re.IGNORECASE):
            return fam
    return "other"


def peak(device):
    for part, flops, bw in PEAKS:
        if part in device:
            return {"flops": flops, "bytes_per_s": bw, "source": f"{device}, dense bf16 and HBM from the datasheet"}
    return {"flops": None, "bytes_per_s": None, "source": f"{device}: not a known part"}


def phase_at(t_us, ranges):
    """The phase of the innermost range (phase, start_us, end_us) holding time t_us; "other" outside them all."""
    inside = [(end - start, phase) for phase, start, end in ranges if start <= t_us <= end]
    return min(inside)[1] if inside else "other"


def gemm_flops(gemms):
    """{(kernel, phase): [flops, launches]} from the GEMM operations (flops, [(kernel, dur_us) it launched], phase):
    an operation's FLOPs go to the longest of its kernels, the GEMM (cuBLAS may add a split-K reduction or a
    memset, which do none)."""
    out = {}
    for flops, kernels, phase in gemms:
        if kernels:
            acc = out.setdefault((max(kernels, key=lambda k: k[1])[0], phase), [0.0, 0])
            acc[0] += flops
            acc[1] += 1
    return out


def busy_us(intervals):
    """The length of the union of (start_us, dur_us) intervals: kernels on several streams may overlap."""
    total, end = 0.0, float("-inf")
    for start, dur in sorted(intervals):
        if start + dur > end:
            total += start + dur - max(start, end)
            end = start + dur
    return total


def account(kernels, *, wall_s, steps, first_step, device, flops=None):
    """The kernels.json document of `steps` profiled steps, the first numbered first_step, which took wall_s in
    all. kernels: (name, start_us, dur_us, phase) of every kernel the steps ran; flops: gemm_flops's map. Times,
    FLOPs and launches are totals over the steps, as the trainer's."""
    flops = flops or {}
    pk = peak(device)
    groups = {}
    for name, start, dur, phase in kernels:
        g = groups.setdefault((name, phase), [0, 0.0])
        g[0] += 1
        g[1] += dur
    ops = []
    for (name, phase), (launches, dur_us) in groups.items():
        time_s = dur_us / 1e6
        f = flops.get((name, phase))
        # Known only when every launch came from a counted GEMM operation: a partial sum would read as slow.
        op_flops = f[0] if f and f[1] == launches else None
        tflops = op_flops / time_s / 1e12 if op_flops is not None and time_s > 0 else None
        # No bytes from the profiler: the compute roof is the roof, as it is for GEMMs of GPT-2 widths, whose
        # FLOPs per byte are above a Hopper's ridge (about 200).
        roofline = tflops * 1e12 / pk["flops"] if tflops is not None and pk["flops"] else None
        ops.append({"name": name, "family": family(name), "phase": phase, "shape": None, "calls": launches,
                    "launches": launches, "time_s": time_s, "flops": op_flops, "ideal_bytes": None, "tflops": tflops,
                    "gbps": None, "roofline_fraction": roofline, "bound": "compute" if roofline is not None else None,
                    "kernels": [{"name": name, "launches": launches, "time_s": time_s}]})
    ops.sort(key=lambda o: -o["time_s"])
    step_s = wall_s
    busy_s = busy_us([(start, dur) for _, start, dur, _ in kernels]) / 1e6
    return {"device": device, "emulated": False, "times": "measured", "steps": [first_step, first_step + steps - 1],
            "step_time_s": step_s, "busy_s": busy_s, "unaccounted_s": step_s - busy_s,
            "unaccounted_share": (step_s - busy_s) / step_s if step_s > 0 else None, "peak": pk,
            "operations": ops}


def table(doc, limit=40):
    """The operations by time, as lines of text: the longest `limit`, then the rest in one line."""
    n = doc["steps"][1] - doc["steps"][0] + 1
    step = doc["step_time_s"] / n
    lines = [f"{doc['device']}, steps {doc['steps'][0]}-{doc['steps'][1]}: step {step * 1e3:.2f} ms, kernels busy "
             f"{doc['busy_s'] / n * 1e3:.2f} ms, unaccounted {doc['unaccounted_s'] / n * 1e3:.2f} ms "
             f"({doc['unaccounted_share']:.1%})",
             f"{'ms/step':>9}{'share':>7}{'launch':>7}{'TFLOP/s':>9}  {'family':<11}{'phase':<10}kernel"]
    ops = doc["operations"]
    for o in ops[:limit]:
        tf = f"{o['tflops']:.1f}" if o["tflops"] is not None else "-"
        name = o["name"] if len(o["name"]) <= 90 else o["name"][:87] + "..."
        lines.append(f"{o['time_s'] / n * 1e3:>9.3f}{o['time_s'] / n / step:>7.1%}{o['launches'] / n:>7.0f}{tf:>9}  "
                     f"{o['family']:<11}{o['phase']:<10}{name}")
    rest = ops[limit:]
    if rest:
        t = sum(o["time_s"] for o in rest)
        lines.append(f"{t / n * 1e3:>9.3f}{t / n / step:>7.1%}{'':>7}{'':>9}  ({len(rest)} more operations)")
    return lines
