"""Checks a `yuanlm export` directory against `yuanlm eval`: rebuilds GPT-2 from model.safetensors and config.json
the way HuggingFace's GPT2LMHeadModel computes it, measures the loss on the windows eval measured, and compares.

    /usr/bin/python3 tools/check_export.py EXPORT_DIR --eval EVAL_OUT [--data GLOB] [--tol 1e-4]

EVAL_OUT is what `yuanlm eval --json` printed (its last line is the JSON object: val_loss, windows, seq_len,
data). transformers is not needed: the model below follows modeling_gpt2.py (Conv1D y = x @ W + b with W
[in, out], gelu_new, LayerNorm eps from config.json, causal softmax attention scaled by 1/sqrt(head_dim), lm_head
tied to wte) in float32, as from_pretrained would run it. The file is also checked for exactly the tensor
names, shapes and metadata from_pretrained expects. Exit status 1 when the relative difference exceeds --tol.
"""
import argparse
import glob
import json
import math
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from safetensors_f32 import read_f32


def read_safetensors(path):
    arrays, meta = read_f32(path)
    return {name: torch.from_numpy(a.copy()) for name, a in arrays.items()}, meta


def expected_shapes(cfg):
    C, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    inner = cfg["n_inner"] or 4 * C
    shapes = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C],
              "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                       p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                       p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                       p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                       p + "mlp.c_fc.weight": [C, inner], p + "mlp.c_fc.bias": [inner],
                       p + "mlp.c_proj.weight": [inner, C], p + "mlp.c_proj.bias": [C]})
    return shapes


def check_format(cfg, tensors, meta):
    problems = []
    if meta.get("format") != "pt":
        problems.append(f"safetensors metadata format is {meta.get('format')!r}, transformers needs 'pt'")
    for key, want in [("model_type", "gpt2"), ("architectures", ["GPT2LMHeadModel"]),
                      ("activation_function", "gelu_new"), ("tie_word_embeddings", True)]:
        if cfg.get(key) != want:
            problems.append(f"config.json {key} is {cfg.get(key)!r}, expected {want!r}")
    want = expected_shapes(cfg)
    for name in sorted(set(want) | set(tensors)):
        if name not in tensors:
            problems.append(f"missing tensor {name}")
        elif name not in want:
            problems.append(f"unexpected tensor {name}")
        elif list(tensors[name].shape) != want[name]:
            problems.append(f"{name} has shape {list(tensors[name].shape)}, GPT-2 expects {want[name]}")
    if problems:
        sys.exit("export does not match HuggingFace GPT-2:\n  " + "\n  ".join(problems))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_logits(w, cfg, idx):
    """GPT2LMHeadModel.forward(idx).logits, eval mode (dropout off)."""
    B, T = idx.shape
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    ln = lambda x, p: F.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)
    conv1d = lambda x, p: torch.addmm(w[p + ".bias"], x.reshape(-1, x.shape[-1]), w[p + ".weight"]).view(
        *x.shape[:-1], -1)
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][torch.arange(T)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min)).softmax(dim=-1)
        x = x + conv1d((att @ v).transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].t()


def windows(pattern, seq_len, n):
    """The first n windows of seq_len+1 tokens, stride seq_len, shard by shard in sorted order, wrapping around
    (src/data/loader.cpp's Corpus and ValLoader)."""
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"{pattern}: no shard files match")
    shards = []
    for f in files:
        with h5py.File(f, "r") as h:
            shards.append((f, (h["tokens"].shape[0] - 1) // seq_len))
    total = sum(c for _, c in shards)
    out = np.empty((n, seq_len + 1), dtype=np.int64)
    for j in range(n):
        w = j % total
        for f, count in shards:
            if w < count:
                with h5py.File(f, "r") as h:
                    out[j] = h["tokens"][w * seq_len: w * seq_len + seq_len + 1]
                break
            w -= count
    return torch.from_numpy(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--eval", required=True, help="stdout of `yuanlm eval --json` (the last line is read)")
    ap.add_argument("--data", help="shard glob (default: the one eval used)")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest relative difference accepted")
    a = ap.parse_args()

    with open(a.eval) as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    ev = json.loads(lines[-1])
    with open(f"{a.export_dir}/config.json") as f:
        cfg = json.load(f)
    w, meta = read_safetensors(f"{a.export_dir}/model.safetensors")
    check_format(cfg, w, meta)

    tokens = windows(a.data or ev["data"], ev["seq_len"], ev["windows"])
    total = 0.0
    with torch.no_grad():
        for b in range(0, len(tokens), 64):
            batch = tokens[b:b + 64]
            logits = gpt2_logits(w, cfg, batch[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1),
                                     reduction="sum").item()
    loss = total / (tokens.shape[0] * ev["seq_len"])
    rel = abs(loss - ev["val_loss"]) / abs(ev["val_loss"])
    print(f"export {a.export_dir}: loss {loss:.9f} over {len(tokens)} windows; yuanlm eval val_loss "
          f"{ev['val_loss']:.9f}; relative difference {rel:.2e} (tolerance {a.tol:g})")
    if not rel <= a.tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
