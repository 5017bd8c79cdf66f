"""Float64 PyTorch truth for the tiny GPT-2 that tests/test_reference.cpp checks the C++ model against.

Regenerate (deterministic; the output is committed):
    /usr/bin/python3 tools/make_reference.py [out.safetensors]     # default tests/data/gpt_tiny_ref.safetensors

The model is written out here (nanoGPT style) rather than taken from transformers, so the fixture depends only
on torch. Parameter names and layouts are yuanlm's: HuggingFace GPT-2 names without "transformer.", matrices
[out, in] as nn.Linear stores them. Contents (config in __metadata__, every value as a string):
    param.<name>   F32  initial parameters (exactly representable, so the float64 run starts from them)
    tokens         I32  [steps, B, T+1] one batch per training step: inputs row[:T], targets row[1:]
    logits         F32  [B, T, V] of tokens[0] at the initial parameters
    loss           F64  [] mean cross-entropy over the B*T targets of tokens[0] at the initial parameters
    grad.<name>    F32  gradient of that loss
    losses, grad_norms, lrs   F64 [steps]  per training step: loss, global grad norm before clipping, lr
    final.<name>   F32  parameters after `steps` AdamW steps (clip_grad_norm_, then torch.optim.AdamW)
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors_f32 import write_safetensors

CFG = dict(n_layer=2, n_head=4, n_embd=32, seq_len=12, vocab_size=97, batch=3, steps=3, seed=1234)
# OptimConfig of the run; the schedule is src/optim/lr_schedule.cpp's. eps is 1e-5, not the usual 1e-8: with 1e-8,
# AdamW's first steps are ~lr*sign(g), so elements whose gradient is within float32 rounding of zero (all of
# c_attn's key bias, whose gradient is exactly zero by softmax shift invariance, and a few others) move by up to
# lr in a float32 run and ~0 in the truth; a float32 torch run then misses the final parameters by 1e-3. With
# 1e-5 it stays within ~1e-6, and eps is large enough that eps placement and gradient clipping (Adam is
# otherwise scale invariant) change the final parameters by ~1e-3, so the test sees them.
OPT = dict(lr=1e-3, warmup_steps=2, min_lr=1e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-5, grad_clip=1.0)


class Attention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.n_head)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, n_head)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["seq_len"], c["n_embd"])
        self.h = nn.ModuleList(Block(c["n_embd"], c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=1e-5)

    def forward(self, idx):  # idx [B, T] -> logits [B, T, V]; the classifier is tied to wte
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()

    def loss(self, tokens):  # tokens [B, T+1]; mean cross-entropy over B*T targets
        logits = self(tokens[:, :-1])
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def lr_at(step, total):  # src/optim/lr_schedule.cpp
    o = OPT
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    decay_steps = total - o["warmup_steps"]
    if decay_steps <= 1:
        return o["lr"]
    progress = min(1.0, (step - o["warmup_steps"]) / (decay_steps - 1))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * progress))


def initial_params(model, gen):
    # Not GPT-2's init on purpose: with N(0, 0.02) weights this tiny model has nearly uniform attention and
    # nearly flat logits, which would hide bugs. Every tensor gets random values of a size that keeps
    # activations O(1): matrices N(0, 1/fan_in), embeddings N(0, 0.3), LayerNorm gains 1 + N(0, 0.1), biases
    # N(0, 0.1). Values are rounded to float32 so the stored F32 parameters are exactly the truth's start.
    out = {}
    for name, p in model.named_parameters():
        if name in ("wte.weight", "wpe.weight"):
            v = 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        elif p.dim() == 2:
            v = torch.randn(p.shape, generator=gen, dtype=torch.float64) / math.sqrt(p.shape[1])
        elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        else:
            v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        out[name] = v.float()
    return out


def run(init, tokens, dtype):
    """The reference computation in `dtype`: step-0 logits/loss/grads, then the training steps."""
    torch.manual_seed(0)  # nn.Module construction draws random numbers; they are overwritten below
    model = GPT(CFG).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name].to(dtype))
    params = dict(model.named_parameters())

    logits, loss = model.loss(tokens[0])
    loss.backward()
    res = dict(logits=logits.detach(), loss=loss.item(), grads={n: p.grad.clone() for n, p in params.items()})

    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=OPT["weight_decay"]),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    losses, norms, lrs = [], [], []
    steps = CFG["steps"]
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = model.loss(tokens[step])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), OPT["grad_clip"]).item())
        lr = lr_at(step, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(loss.item())
        lrs.append(lr)
    res.update(losses=losses, norms=norms, lrs=lrs, final={n: p.detach().clone() for n, p in params.items()})
    return res


def max_rel(a, b):  # the tests' metric: max|a-b| / max|b| over the tensor
    return (a.double() - b.double()).abs().max().item() / b.double().abs().max().item()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/gpt_tiny_ref.safetensors"
    gen = torch.Generator().manual_seed(CFG["seed"])
    init = initial_params(GPT(CFG), gen)
    B, T, V, S = CFG["batch"], CFG["seq_len"], CFG["vocab_size"], CFG["steps"]
    tokens = torch.randint(0, V, (S, B, T + 1), generator=gen)

    ref = run(init, tokens, torch.float64)
    clipped = [n > OPT["grad_clip"] for n in ref["norms"]]
    assert any(clipped), f"clipping never active: grad norms {ref['norms']}"

    # How close float32 arithmetic can get to the truth: the headroom behind the C++ tests' tolerances.
    f32 = run(init, tokens, torch.float32)
    print(f"float32 torch vs float64 truth (max|a-b|/max|ref|): logits {max_rel(f32['logits'], ref['logits']):.1e}"
          f", grads {max(max_rel(f32['grads'][n], g) for n, g in ref['grads'].items()):.1e}"
          f", final params {max(max_rel(f32['final'][n], p) for n, p in ref['final'].items()):.1e}")

    t = {"tokens": tokens.to(torch.int32).numpy(),
         "logits": ref["logits"].float().numpy(),
         "loss": np.array(ref["loss"], dtype=np.float64),
         "losses": np.array(ref["losses"], dtype=np.float64),
         "grad_norms": np.array(ref["norms"], dtype=np.float64),
         "lrs": np.array(ref["lrs"], dtype=np.float64)}
    for name in init:
        t["param." + name] = init[name].numpy()
        t["grad." + name] = ref["grads"][name].float().numpy()
        t["final." + name] = ref["final"][name].float().numpy()
    meta = {k: repr(v) for k, v in {**CFG, **OPT}.items()}
    write_safetensors(out, t, meta)
    print(f"wrote {out}: loss {ref['loss']:.6f}, losses {ref['losses']}, grad norms {ref['norms']} "
          f"(clip {OPT['grad_clip']}: clipped {clipped}), lrs {ref['lrs']}")


if __name__ == "__main__":
    main()
