"""PyTorch peer of bin/bench_gpu_train on the same GPU: the same GPT-2 (learned positions, pre-LayerNorm, tied
embeddings, biases, GELU tanh), trained the way a strong PyTorch user would: bf16 autocast over fp32 weights,
F.scaled_dot_product_attention(is_causal=True) (flash / cuDNN kernels), torch.compile, fused AdamW, global-norm
clipping, on random tokens. Prints one JSON line per config: {"name", "B", "tokens_per_s"}.

usage: python3 tools/bench/gpt_torch.py --configs '[{"name": "gpt-small", "n_layer": 12, "n_head": 12,
           "n_embd": 768, "seq_len": 1024, "vocab_size": 50257, "B": 16}, ...]' [--steps 10]
A config that runs out of memory at B is retried at B/2 (the line reports the B used).
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def bench(c, B, steps):
    torch.manual_seed(0)
    model = GPT(c).cuda()
    params = list(model.parameters())
    opt = torch.optim.AdamW([dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                             dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)],
                            lr=1e-4, betas=(0.9, 0.95), fused=True)
    step_fn = torch.compile(model)
    tokens = torch.randint(0, c["vocab_size"], (B, c["seq_len"] + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # compilation and autotuning
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return B * c["seq_len"] * steps / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", required=True)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for c in json.loads(args.configs):
        B = c["B"]
        while B >= 1:
            try:
                print(json.dumps(dict(name=c["name"], B=B, tokens_per_s=bench(c, B, args.steps))), flush=True)
                break
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                B //= 2
        else:
            print(json.dumps(dict(name=c["name"], B=0, tokens_per_s=0.0, error="out of memory at B=1")), flush=True)


if __name__ == "__main__":
    main()
