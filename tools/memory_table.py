"""Which 3D layouts hold a model on a GPU machine, and the largest model each machine holds, from `yuanlm plan`.

    /usr/bin/python3 tools/memory_table.py [--bin bin/yuanlm] [--gpus 1,8,64] [--device-gib 80] [--host-gib 128]
                                           [--global-batch 512] [--jobs 8]

Every number comes from `yuanlm plan ... --json` (the plans the trainer allocates by, planned for the cuda
backend; docs/MEMORY.md states them), so no GPU is needed. A layout fits when every stage's rank needs at most
--device-gib of device memory and --host-gib of host memory (optimizer state and pinned staging; a node of 8 GPUs
with 1 TiB of host memory gives each 128 GiB).

Part 1, the ASC22 Yuan model (40 layers, 3072 wide, 24 heads, seq 2048, vocab 53248: 4.70B parameters) on each
GPU count N: every layout tp T x pipeline stages P x data-parallel replicas D = N (T at most 8, one node's NVLink
domain; pipelines cut by `auto:P`, 1F1B, each pipeline running global_batch / (D x micro_batch) micro-batches),
for ZeRO stages 0-3 (3 only with one stage), the largest micro-batch (16, 8, 4, 2, 1) that fits without activation
recompute, else with it. A cell reads `mb 2 | 61/9`: micro-batch 2 fits, needing 61 GiB of device and 9 GiB of
host memory on the fullest rank; `mb 1 rc` means only with recompute; `-` means nothing fits.

Part 2, the largest model each N holds: models of head size 128 and widths 3072-12288 (vocab 53248, seq 2048),
the most layers that fit with micro-batch 1, recompute and the leanest ZeRO stage the layout allows (3 with one
stage, 2 with pipelines), over every layout of part 1.
"""
import argparse
import concurrent.futures
import json
import subprocess
import sys

GIB = 2**30
YUAN = dict(n_layer=40, n_embd=3072, n_head=24)


def plan(args, model, tp, stages, replicas, zero, micro_batch, recompute):
    """The fullest rank's (device, host) bytes of a layout, or raises with plan's error."""
    n = tp * stages * replicas
    cmd = [args.bin, "plan", "--json", "--train.device=cuda", "--data.train=/nonexistent/*.h5",
           f"--model.n_layer={model['n_layer']}", f"--model.n_embd={model['n_embd']}",
           f"--model.n_head={model['n_head']}", "--model.seq_len=2048", "--model.vocab_size=53248",
           f"--train.global_batch={args.global_batch}", f"--train.micro_batch={micro_batch}",
           f"--train.recompute={'true' if recompute else 'false'}", f"--optim.zero={zero}",
           f"--parallel.tp_size={tp}"]
    if stages == 1:
        cmd.append(f"--world={n}")
    else:
        m = args.global_batch // (replicas * micro_batch)
        cmd += [f"--parallel.template=p: auto:{stages}", "--parallel.pipelines=" + ",".join(["p"] * replicas),
                f"--parallel.microbatches=p:{m}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or out.stdout.strip())
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    return (max(r["device_bytes"]["total"] for r in rows), max(r["host_bytes"]["total"] for r in rows))


def fits(args, mem):
    return mem[0] <= args.device_gib * GIB and mem[1] <= args.host_gib * GIB


def layouts(n, n_layer):
    """(T, P, D) with T x P x D = n, T at most 8, P at most the layers."""
    for tp in (1, 2, 4, 8):
        for stages in range(1, n // tp + 1):
            if n % (tp * stages) == 0 and stages <= n_layer:
                yield tp, stages, n // (tp * stages)


def micro_batches(args, replicas):
    return [mb for mb in (16, 8, 4, 2, 1) if args.global_batch % (replicas * mb) == 0]


def best_fit(args, tp, stages, replicas, zero):
    """The first setting that fits, from the largest micro-batch without recompute to micro-batch 1 with it."""
    for recompute in (False, True):
        for mb in micro_batches(args, replicas):
            mem = plan(args, YUAN, tp, stages, replicas, zero, mb, recompute)
            if fits(args, mem):
                return f"mb {mb}{' rc' if recompute else ''} \\| {mem[0] / GIB:.0f}/{mem[1] / GIB:.0f}"
    return "-"


def most_layers(args, n, width, layout):
    """The most layers (up to 512) of a model `width` wide that fit the layout, by bisection; 0 if none."""
    tp, stages, replicas = layout
    zero = 3 if stages == 1 else 2
    model = dict(n_embd=width, n_head=width // 128)

    def ok(layers):
        try:
            return fits(args, plan(args, dict(model, n_layer=layers), tp, stages, replicas, zero, 1, True))
        except RuntimeError:
            return False
    lo, hi = 0, 512
    if not ok(max(stages, 1)):
        return 0
    lo = max(stages, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def params(layers, width, vocab=53248, seq=2048):
    return layers * 12 * width * width + layers * 13 * width + (vocab + seq) * width + 2 * width


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="bin/yuanlm")
    p.add_argument("--gpus", default="1,8,64")
    p.add_argument("--device-gib", type=float, default=80)
    p.add_argument("--host-gib", type=float, default=128)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--jobs", type=int, default=8)
    args = p.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)

    print(f"Yuan-4.7B, global batch {args.global_batch} x 2048 tokens, {args.device_gib:g} GiB device and "
          f"{args.host_gib:g} GiB host per GPU; cells: setting \\| device/host GiB of the fullest rank\n")
    for n in gpus:
        print(f"**{n} GPU{'s' if n > 1 else ''}**\n")
        print("| tp | stages | replicas | ZeRO-0 | ZeRO-1 | ZeRO-2 | ZeRO-3 |")
        print("|---:|---:|---:|---|---|---|---|")
        rows = [(lay, [pool.submit(best_fit, args, *lay, z) if z < 3 or lay[1] == 1 else None for z in range(4)])
                for lay in layouts(n, YUAN["n_layer"]) if micro_batches(args, lay[2])]
        for (tp, stages, replicas), cells in rows:
            text = [c.result() if c else "n/a" for c in cells]
            print(f"| {tp} | {stages} | {replicas} | " + " | ".join(text) + " |")
        print()

    print("Largest model (head size 128, micro-batch 1, recompute; ZeRO-3 with one stage, ZeRO-2 with pipelines)\n")
    print("| GPUs | layout (tp x stages x replicas) | width | layers | parameters |")
    print("|---:|---|---:|---:|---:|")
    for n in gpus:
        jobs = [(w, lay, pool.submit(most_layers, args, n, w, lay))
                for w in (3072, 4096, 5120, 6144, 8192, 12288) for lay in layouts(n, 512)
                if micro_batches(args, lay[2])]
        best = max(((params(j.result(), w), w, lay, j.result()) for w, lay, j in jobs), key=lambda b: b[0])
        size, width, (tp, stages, replicas), layers = best
        print(f"| {n} | {tp} x {stages} x {replicas} | {width} | {layers} | {size / 1e9:.1f}B |")


if __name__ == "__main__":
    sys.exit(main())
