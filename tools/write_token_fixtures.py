#!/usr/bin/python3
"""Writes tokenized corpora in other trainers' layouts with numpy, independently of yuanlm's reader.

megatron: Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py), PREFIX.idx and PREFIX.bin.
llmc: llm.c's token file (dev/data/data_common.py), a 256 x int32 header and the tokens.
The documents are seeded random ids in [1, vocab); --expect writes them as JSON, each with the eot id yuanlm puts
before it, for the test to compare the shards against. The --bad-* options make the malformed files yuanlm must
refuse.
"""
import argparse
import json

import numpy as np

MEGATRON_DTYPES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7,
                   "uint16": 8}


def documents(n, vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(1, 60)) for _ in range(n)]


def write_megatron(a, docs):
    # A document of two sequences now and then, as Megatron writes sentence-split documents.
    seqs, doc_idx = [], [0]
    for d in docs:
        cut = len(d) // 2 if len(d) > 4 and len(seqs) % 3 == 0 else len(d)
        seqs += [d[:cut], d[cut:]] if cut < len(d) else [d]
        doc_idx.append(len(seqs))
    dtype = np.dtype(a.dtype)
    lengths = np.array([len(s) for s in seqs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]).astype(np.int64) * dtype.itemsize
    if a.bad_pointer:
        pointers[-1] += dtype.itemsize * 1000
    with open(a.path + ".bin", "wb") as f:
        for s in seqs:
            f.write(s.astype(dtype).tobytes())
    with open(a.path + ".idx", "wb") as f:
        f.write(b"MMIDIDY\x00\x00" if a.bad_magic else b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype="<u8").tobytes())
        f.write(np.array([MEGATRON_DTYPES[a.dtype]], dtype=np.uint8).tobytes())
        f.write(np.array([len(seqs), len(doc_idx)], dtype="<u8").tobytes())
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.array(doc_idx, dtype="<i8").tobytes())


def write_llmc(a, docs):
    # llm.c's writers put the eot token before every document.
    tokens = np.concatenate([np.concatenate([[a.eot], d]) for d in docs])
    magic, version, dtype = (20240801, 7, "<u4") if a.llama3 else (20240520, 1, "<u2")
    header = np.zeros(256, dtype="<i4")
    header[0:3] = magic + 1 if a.bad_magic else magic, version, len(tokens)
    with open(a.path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype).tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("format", choices=["megatron", "llmc"])
    p.add_argument("path", help="megatron: the PREFIX; llmc: the file")
    p.add_argument("--docs", type=int, default=50)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--eot", type=int, default=0, help="the tokenizer's eot id (never drawn as a document token)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtype", default="uint16", help="megatron: the token dtype (uint16, int32, float32, ...)")
    p.add_argument("--llama3", action="store_true", help="llmc: Llama 3's layout (uint32 tokens), not GPT-2's")
    p.add_argument("--expect", help="write the documents, each led by --eot, as JSON here")
    p.add_argument("--bad-magic", action="store_true")
    p.add_argument("--bad-pointer", action="store_true", help="megatron: the last sequence points past the .bin")
    p.add_argument("--bad-id", type=int, help="make the first token of the third document this id")
    a = p.parse_args()

    docs = documents(a.docs, a.vocab, a.seed)
    docs = [d[d != a.eot] if len(d[d != a.eot]) else np.array([a.eot + 1]) for d in docs]
    if a.bad_id is not None:
        docs[2] = docs[2].copy()
        docs[2][0] = a.bad_id
    (write_megatron if a.format == "megatron" else write_llmc)(a, docs)
    if a.expect:
        with open(a.expect, "w") as f:
            json.dump([[a.eot] + d.tolist() for d in docs], f)


if __name__ == "__main__":
    main()
