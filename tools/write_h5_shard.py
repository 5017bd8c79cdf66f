#!/usr/bin/python3
"""Writes a yuanlm token shard (docs/FORMAT.md) with h5py, independently of the C++ writer.

The tests use it to check that the reader takes any file that follows the schema, and to make malformed ones.
Token i is (i * 7919 + 13) % vocab, so a reader can check every id without a copy of the data.
"""
import argparse

import h5py
import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("path")
    p.add_argument("--n", type=int, default=1000, help="tokens")
    p.add_argument("--vocab", type=int, default=500)
    p.add_argument("--eot", type=int, default=0)
    p.add_argument("--tokenizer", default="test:sha256:0")
    p.add_argument("--dtype", default="uint16", help="numpy dtype of /tokens, e.g. uint32, >u2 (big-endian), int32, float32")
    p.add_argument("--rank", type=int, default=1, help="2 writes /tokens as (n/2, 2)")
    p.add_argument("--chunks", type=int, default=0, help="chunk length (0: contiguous)")
    p.add_argument("--gzip", action="store_true", help="compress the chunks")
    p.add_argument("--bad-id-at", type=int, default=-1, help="write id = vocab at this offset")
    p.add_argument("--no-tokens", action="store_true", help="leave out /tokens")
    a = p.parse_args()

    tokens = (np.arange(a.n, dtype=np.uint64) * 7919 + 13) % a.vocab
    if a.bad_id_at >= 0:
        tokens[a.bad_id_at] = a.vocab
    data = tokens.astype(a.dtype)
    if a.rank == 2:
        data = data.reshape(-1, 2)
    with h5py.File(a.path, "w") as f:
        if not a.no_tokens:
            chunks = (a.chunks,) if a.chunks and a.rank == 1 else None
            f.create_dataset("tokens", data=data, chunks=chunks, compression="gzip" if a.gzip else None)
        f.attrs["format_version"] = 1
        f.attrs["vocab_size"] = a.vocab
        f.attrs["eot_id"] = a.eot
        f.attrs["tokenizer"] = a.tokenizer


if __name__ == "__main__":
    main()
