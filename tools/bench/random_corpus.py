"""Random tokens in the shard format of `yuanlm prep` (docs/FORMAT.md), for timing GPT-2-sized models where the
corpus does not matter: 2 shards of 2M tokens below 50257, vocab_size 50304 (input/gpt-small.ini's).

usage: python3 tools/bench/random_corpus.py DIR
"""
import os
import sys

import h5py
import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1)
for i in range(2):
    with h5py.File(f"{out}/shard_{i:03d}.h5", "w") as f:
        f.create_dataset("tokens", data=rng.integers(0, 50257, 2_000_000, dtype=np.uint16), chunks=(65536,))
        f.attrs["format_version"] = 1
        f.attrs["vocab_size"] = 50304
        f.attrs["eot_id"] = 50256
        f.attrs["tokenizer"] = "synthetic:none"
