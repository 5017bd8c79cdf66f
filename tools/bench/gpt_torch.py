"""PyTorch peer of bin/bench_gpu_train on the same GPU: the same GPT-2 (learned positions, pre-LayerNorm, tied
embeddings, biases, GELU tanh), trained the way a strong PyTorch user would: bf16 autocast over fp32 weights,
F.scaled_dot_product_attention(is_causal=True) (flash / cuDNN kernels), torch.compile, fused AdamW, global-norm
clipping, on random tokens. Prints one JSON line per config: {"name", "B", "tokens_per_s"}.

usage: python3 tools/bench/gpt_torch.py --configs '[{"name": "gpt-small", "n_layer": 12, "n_head": 12,
           "n_embd": 768, "seq_len": 1024, "vocab_size": 50257, "B": 16}, ...]' [--steps 10]
           [--account DIR [--account-steps 2]]
A config that runs out of memory at B is retried at B/2 (the line reports the B used).

With --account, the steps after warm-up are not timed but profiled (torch.profiler, CUDA kernels, GEMM FLOPs): the
per-kernel account of the trainer's --profile.kernels, written to DIR/kernels_torch_<name>.json in the schema of
its kernels.json (tools/bench/torch_account.py) and printed as a table by time; tools/kernel_account.py sets the
two side by side.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

import torch_account

RANGE = "account:"  # the record_function ranges of a step's phases: account:forward, ...
WARMUP = 3  # steps before the timed or profiled ones: compilation and autotuning


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["seq_len"], c["n_embd"])
        self.h = nn.ModuleList(Block(c["n_embd"], c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def make_step(loss_fn, params, opt, device_type):
    """One training step, each phase in a record_function range that the account reads the phase from."""
    def step():
        with record_function(RANGE + "forward"), torch.autocast(device_type, dtype=torch.bfloat16):
            loss = loss_fn()
        with record_function(RANGE + "backward"):
            loss.backward()
        with record_function(RANGE + "optimizer"):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return step


def profile(step, steps, cuda):
    """Profiles `steps` calls of step(); returns the profiler's events and their wall time in seconds."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with torch.profiler.profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = time.perf_counter() - t0
    return prof.events(), wall


def phase_ranges(events):
    """The phase ranges (phase, start_us, end_us) on the host, and on the device where the profiler put them
    there too: a kernel runs after its launch, so only the device's ranges say which phase it ran in."""
    host, device = [], []
    for e in events:
        if e.name.startswith(RANGE):
            r = (e.name[len(RANGE):], e.time_range.start, e.time_range.end)
            (device if e.device_type == DeviceType.CUDA else host).append(r)
    return host, device


def profiled_kernels(events):
    """(name, start_us, dur_us, phase) of every kernel among the events, and the GEMMs' FLOPs by kernel and
    phase (torch_account.gemm_flops)."""
    host, device = phase_ranges(events)
    if not device:
        print("gpt_torch: no phase ranges on the device; phases from the host's, where kernels run late",
              file=sys.stderr)
    ranges = device or host
    kernels = []
    for e in events:
        # The device's ranges are annotations, not kernels (torch 2 marks them so, torch 1 only by their name).
        if e.device_type == DeviceType.CUDA and not e.name.startswith(RANGE) and not getattr(
                e, "is_user_annotation", False):
            start = e.time_range.start
            kernels.append((e.name, start, e.time_range.elapsed_us(), torch_account.phase_at(start, ranges)))
    # An operation runs on the host inside its phase's range, so the host's ranges give its phase.
    gemms = [(e.flops, [(k.name, k.duration) for k in e.kernels],
              torch_account.phase_at(e.time_range.start, host))
             for e in events if e.name in torch_account.GEMM_OPS and e.flops]
    return kernels, torch_account.gemm_flops(gemms)


def training_step(c, B):
    """The compiled model's training step at micro-batch B, on random tokens, after its warm-up steps."""
    torch.manual_seed(0)
    model = GPT(c).cuda()
    params = list(model.parameters())
    opt = torch.optim.AdamW([dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                             dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)],
                            lr=1e-4, betas=(0.9, 0.95), fused=True)
    step_fn = torch.compile(model)
    tokens = torch.randint(0, c["vocab_size"], (B, c["seq_len"] + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]
    step = make_step(lambda: step_fn(x, y), params, opt, "cuda")
    for _ in range(WARMUP):
        step()
    return step


def bench(c, B, steps):
    step = training_step(c, B)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return B * c["seq_len"] * steps / (time.perf_counter() - t0)


def kernel_account(c, B, steps):
    events, wall = profile(training_step(c, B), steps, cuda=True)
    kernels, flops = profiled_kernels(events)
    return torch_account.account(kernels, wall_s=wall, steps=steps, first_step=WARMUP + 1,
                                 device=torch.cuda.get_device_name(), flops=flops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--account", metavar="DIR", help="profile instead of timing: DIR/kernels_torch_<name>.json")
    ap.add_argument("--account-steps", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpt_torch: no CUDA device (torch.cuda.is_available() is false), nothing to measure")
    torch.backends.cuda.matmul.allow_tf32 = True
    for c in json.loads(args.configs):
        B = c["B"]
        while B >= 1:
            try:
                if args.account:
                    doc = kernel_account(c, B, args.account_steps)
                    path = os.path.join(args.account, f"kernels_torch_{c['name']}.json")
                    with open(path, "w") as f:
                        json.dump(dict(doc, config=dict(c, B=B)), f, indent=1)
                    print(f"{c['name']}, B {B} x T {c['seq_len']}: {path}")
                    print("\n".join(torch_account.table(doc)), flush=True)
                else:
                    print(json.dumps(dict(name=c["name"], B=B, tokens_per_s=bench(c, B, args.steps))), flush=True)
                break
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                B //= 2
        else:
            print(json.dumps(dict(name=c["name"], B=0, tokens_per_s=0.0, error="out of memory at B=1")), flush=True)


if __name__ == "__main__":
    main()
