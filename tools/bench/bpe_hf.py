"""The peer of bin/bench_prep_bpe: HuggingFace `tokenizers` encoding the same documents with the same tokenizer on
the same number of threads (RAYON_NUM_THREADS, set before the import), best of 3. Prints `tokens N` and
`tokens_per_s X` (encode_batch), `fast_tokens_per_s X` (encode_batch_fast, which skips the offsets, where the
version has it), or one line saying why it cannot run.

usage: /usr/bin/python3 tools/bench/bpe_hf.py TOKENIZER_JSON DOCS_JSONL THREADS
"""
import json
import os
import sys
import time

tokenizer, docs_path, threads = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["RAYON_NUM_THREADS"] = threads
try:
    from tokenizers import Tokenizer
except ImportError:
    print("HF tokenizers is not importable: pip install tokenizers")
    sys.exit(2)
tok = Tokenizer.from_file(tokenizer)
with open(docs_path, encoding="utf-8") as f:
    docs = [json.loads(line)["text"] for line in f]


def best_rate(encode_batch):
    encode_batch(docs[:1000])  # warm-up: thread pool, caches
    best, tokens = 1e30, 0
    for _ in range(3):
        t0 = time.perf_counter()
        tokens = sum(len(e.ids) for e in encode_batch(docs))
        best = min(best, time.perf_counter() - t0)
    return tokens, tokens / best


tokens, rate = best_rate(tok.encode_batch)
print(f"tokens {tokens}")
print(f"tokens_per_s {rate:.1f}")
if hasattr(tok, "encode_batch_fast"):
    print(f"fast_tokens_per_s {best_rate(tok.encode_batch_fast)[1]:.1f}")
