"""Each parallel layout's communication per step, as its design implies, against what the trainer counted.

    /usr/bin/python3 tools/comm_volume.py L C T V B G NAME=RUN_DIR ... [--exact]

The runs are 2-rank jobs on the CPU backend (4-byte weights, gradients and activations) of a model of L blocks
of width C, seq T, vocab V, micro-batch B, global batch G, one of the layouts named below; the trainer's metrics
(comm_bytes of the last step: the whole buffer a rank passes to each collective, by group and operation; a
ring's wire carries (D-1)/D of a reduce-scatter or all-gather of it and 2(D-1)/D of an all-reduce) are printed
against the design, with Psi parameters, Psi_b in each block, Psi_e outside the blocks, n micro-batches per
rank per step:

    zero0  data all-reduce 4 Psi
    zero1  data reduce-scatter 4 Psi, all-gather 4 Psi
    zero2  data reduce-scatter 4 Psi n (each micro-batch's gradients leave during its backward), all-gather 4 Psi
    zero3  data reduce-scatter 4 Psi n, all-gather 4 (Psi_e + (2 n L - 2 (2 n - 1)) Psi_b): wte, wpe, ln_f once
           per step, each block for each forward and backward pass, less the two blocks still in the two block
           buffers where one pass turns into the next
    tp2    tensor all-reduce 4 n ((4 L + 2) B T C + 3 B T): two per block each way, the embedding's output and the
           head's input gradient, the classifier's row maxima (B T) and sums (2 B T)
    pp2    pipeline send 4 n B T C (stage 0's activations; stage 1 sends as many gradients back), and wte, which
           both stages hold (the tied classifier), reduce-scattered and gathered over the pipeline group: 4 V C each

Prints one line per run, with tokens/s (mean of the steps after the second) as a ratio to the first run's. With
--exact, exits 1 unless every count equals the design.
"""
import json
import sys


def design(name, L, C, T, V, B, G):
    block = 12 * C * C + 13 * C
    embed = V * C + T * C + 2 * C
    psi = L * block + embed
    n_dp, n = G // (2 * B), G // B  # micro-batches per rank: data parallelism splits the batch, tp and pp do not
    return {
        "zero0": {("data", "all_reduce"): 4 * psi},
        "zero1": {("data", "reduce_scatter"): 4 * psi, ("data", "all_gather"): 4 * psi},
        "zero2": {("data", "reduce_scatter"): 4 * psi * n_dp, ("data", "all_gather"): 4 * psi},
        "zero3": {("data", "reduce_scatter"): 4 * psi * n_dp,
                  ("data", "all_gather"): 4 * (embed + (2 * n_dp * L - 2 * (2 * n_dp - 1)) * block)},
        "tp2": {("tensor", "all_reduce"): 4 * n * ((4 * L + 2) * B * T * C + 3 * B * T)},
        "pp2": {("pipeline", "send"): 4 * n * B * T * C, ("pipeline", "reduce_scatter"): 4 * V * C,
                ("pipeline", "all_gather"): 4 * V * C},
    }[name]


def main(argv):
    exact = "--exact" in argv
    argv = [a for a in argv if a != "--exact"]
    L, C, T, V, B, G = map(int, argv[:6])
    base, ok = None, True
    for arg in argv[6:]:
        name, run = arg.split("=", 1)
        steps = [r for r in map(json.loads, open(f"{run}/metrics.jsonl")) if "loss" in r]
        got = {(g, op): b for g, ops in steps[-1]["comm_bytes"].items() for op, b in ops.items()}
        want = design(name, L, C, T, V, B, G)
        kept = steps[2:] or steps
        speed = sum(r["tokens_per_s"] for r in kept) / len(kept)
        base = base or speed
        parts = []
        for key in sorted(set(want) | set(got)):
            w, g = want.get(key, 0), got.get(key, 0)
            ok = ok and w == g
            parts.append(f"{key[0]} {key[1]} {g / 2**20:.2f} MiB ({f'{g / w:.3f} x design' if w else 'not in the design'})")
        print(f"{name:6s} {speed:8.0f} tokens/s ({speed / base:.2f} x first); per step: " + ", ".join(parts))
    if exact and not ok:
        print("comm_volume: a count differs from its design", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
