"""Writes a HuggingFace GPT-2 directory (config.json, model.safetensors) of random weights, as transformers' GPT-2
code lays it out, for the tests of `yuanlm train --init.from` (tests/mpi/test_init_from.sh) and for a run that
should start from a given model without transformers at hand.

    /usr/bin/python3 tools/make_hf_gpt2.py OUT --n-layer 2 --n-head 2 --n-embd 32 --vocab 64 --positions 24
        [--layout save_pretrained|hub] [--seed 0] [--untied]

--layout save_pretrained: GPT2LMHeadModel.save_pretrained's tensors ("transformer." names, the classifier left to
the tie); hub: the original GPT-2 files' (openai-community/gpt2: names without the prefix, each block's causal mask
buffers "attn.bias" and "attn.masked_bias", and lm_head.weight written out as a copy of wte). The same --seed gives
the same weights in both. --untied makes lm_head.weight differ from wte (a model yuanlm must refuse). Weights are
normal(0, 0.02) for matrices and embeddings, normal(0, 0.1) for biases and around 1 for LayerNorm gains, so that
every tensor's values matter to the loss. numpy only.
"""
import argparse
import json
import os

import numpy as np
from safetensors_f32 import write_safetensors


def weights(n_layer, n_embd, vocab, positions, rng):
    """{name without the "transformer." prefix: array}, in Conv1D layout [in, out] for the blocks' matrices."""
    C = n_embd
    normal = lambda std, *shape: rng.normal(0.0, std, shape).astype(np.float32)
    w = {"wte.weight": normal(0.02, vocab, C), "wpe.weight": normal(0.02, positions, C)}
    for i in range(n_layer):
        p = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = 1.0 + normal(0.1, C)
            w[p + ln + ".bias"] = normal(0.1, C)
        for name, n_in, n_out in (("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C),
                                  ("mlp.c_proj", 4 * C, C)):
            w[p + name + ".weight"] = normal(0.02, n_in, n_out)
            w[p + name + ".bias"] = normal(0.1, n_out)
    w["ln_f.weight"] = 1.0 + normal(0.1, C)
    w["ln_f.bias"] = normal(0.1, C)
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--n-embd", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--positions", type=int, required=True)
    ap.add_argument("--layout", choices=("save_pretrained", "hub"), default="save_pretrained")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untied", action="store_true")
    a = ap.parse_args()

    w = weights(a.n_layer, a.n_embd, a.vocab, a.positions, np.random.default_rng(a.seed))
    if a.layout == "save_pretrained":
        tensors = {"transformer." + k: v for k, v in w.items()}
    else:
        tensors = dict(w)
        T = a.positions
        for i in range(a.n_layer):
            tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
            tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
        tensors["lm_head.weight"] = w["wte.weight"].copy()
    if a.untied:
        tensors["lm_head.weight"] = w["wte.weight"] + np.float32(0.01)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": a.vocab,
           "n_positions": a.positions, "n_ctx": a.positions, "n_embd": a.n_embd, "n_layer": a.n_layer,
           "n_head": a.n_head, "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "tie_word_embeddings": True, "scale_attn_weights": True, "torch_dtype": "float32"}
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
