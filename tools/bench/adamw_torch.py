#!/usr/bin/env python3
"""PyTorch CPU AdamW on one flat tensor: the peer bench_adamw compares against. Prints 'mparams_per_s X'."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(a.n))
    p.grad = torch.randn(a.n) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.step()  # allocates the moments
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    print(f"torch {torch.__version__} threads {a.threads} n {a.n} best_s {best:.6f}")
    print(f"mparams_per_s {a.n / best / 1e6:.3f}")


if __name__ == "__main__":
    main()
