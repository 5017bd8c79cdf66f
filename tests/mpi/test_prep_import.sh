#!/usr/bin/env bash
# `yuanlm prep --format megatron|llmc` (issue 41, item 2): corpora tokenized for Megatron-LM (PREFIX.idx/.bin) and
# llm.c (token files), written here by numpy after the published layouts (tools/write_token_fixtures.py), become
# shards holding the same ids with the same document boundaries; a file that is not what it claims (bad magic, a
# float dtype, a sequence past the .bin, a truncated file, an id outside the vocabulary) is refused with one line
# naming it, and --out is left as it was.
source "$(dirname "$0")/lib.sh"

FIX="$PY tools/write_token_fixtures.py"
# A WordPiece vocabulary of 300 ids whose <eod> (id 0) is the eot_id.
{ echo "<eod>"; echo "[UNK]"; for i in $(seq 298); do echo "w$i"; done; } >"$WORK/vocab.txt"
X=$WORK/x

# same_documents EXPECT.json: the shards in X hold the expected documents, in order, boundaries and all.
same_documents() {
  $PY - "$X" "$1" <<'PYEOF'
import glob, json, sys, h5py, numpy as np
d, expect = sys.argv[1], json.load(open(sys.argv[2]))
tokens, starts = [], []
for f in sorted(glob.glob(f"{d}/train_*.h5")):
    with h5py.File(f) as h:
        base = sum(len(t) for t in tokens)
        starts += [base + int(o) for o in h["doc_offsets"][:]]
        tokens.append(h["tokens"][:])
        assert h.attrs["vocab_size"] == 300 and h.attrs["eot_id"] == 0, dict(h.attrs)
tokens = np.concatenate(tokens).tolist()
docs = [tokens[a:b] for a, b in zip(starts, starts[1:] + [len(tokens)])]
assert docs == expect, f"{len(docs)} documents read back, {len(expect)} written; first differing: " + \
    str(next(((i, x, y) for i, (x, y) in enumerate(zip(docs, expect)) if x != y), None))
m = json.load(open(f"{d}/manifest.json"))
assert sum(s["docs"] for s in m["sources"]) == len(expect) == sum(s["docs"] for s in m["train"]), m
print(f"ok: {len(expect)} documents, {len(tokens)} tokens in {len(m['train'])} shards")
PYEOF
}

# imported FORMAT INPUT EXPECT: prep imports INPUT into X, every document into train, and the shards match.
imported() {
  bin/yuanlm prep --format "$1" --input "$2" --tokenizer "$WORK/vocab.txt" --val-fraction 0 --shard-tokens 400 \
    --out "$X" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  same_documents "$3"
}

$FIX megatron "$WORK/mg" --expect "$WORK/mg.json"
imported megatron "$WORK/mg" "$WORK/mg.json"
$FIX megatron "$WORK/mg32" --dtype int32 --seed 2 --expect "$WORK/mg32.json"
imported megatron "$WORK/mg32" "$WORK/mg32.json"
$FIX llmc "$WORK/a.bin" --expect "$WORK/a.json"
imported llmc "$WORK/a.bin" "$WORK/a.json"
$FIX llmc "$WORK/l3.bin" --llama3 --seed 3 --expect "$WORK/l3.json"
imported llmc "$WORK/l3.bin" "$WORK/l3.json"

# --val-docs: exactly that many documents held out, the rest in train.
bin/yuanlm prep --format llmc --input "$WORK/a.bin" --tokenizer "$WORK/vocab.txt" --val-docs 5 --out "$X" \
  >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
$PY - "$X" <<'PYEOF'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
val, train = sum(s["docs"] for s in m["val"]), sum(s["docs"] for s in m["train"])
assert (val, train) == (5, 45) and m["sources"][0]["format"] == "llmc", (val, train, m["sources"])
print("ok: --val-docs 5 held out 5 of 50 documents")
PYEOF
cp -a "$X" "$WORK/before"

# refused PATTERN ARGS...: prep ARGS fails with one line "error: [rank 0@HOST] PATTERN" (an extended regexp), X as it
# was.
refused() {
  local pattern=$1
  shift
  if bin/yuanlm prep --tokenizer "$WORK/vocab.txt" --out "$X" "$@" >"$WORK/log" 2>&1; then
    echo "prep $* succeeded"; cat "$WORK/log"; exit 1
  fi
  grep -Eq "^error: (\[[^]]*\] )?$pattern\$" "$WORK/log" && [ "$(grep -c . "$WORK/log")" = 1 ] ||
    { echo "prep $*: expected one line 'error: $pattern', got:"; cat "$WORK/log"; exit 1; }
  diff -r "$WORK/before" "$X" || { echo "prep $* changed $X"; exit 1; }
  [ -z "$(ls -A "$WORK" | grep '^\.x\.')" ] || { echo "prep $* left a directory beside $X"; exit 1; }
  echo "ok: $(cat "$WORK/log")"
}

$FIX megatron "$WORK/magic" --bad-magic
refused "$WORK/magic.idx: not a Megatron index: bad magic \(expected \"MMIDIDX\\\\0\\\\0\"\)" \
  --format megatron --input "$WORK/magic"
$FIX megatron "$WORK/float" --dtype float32
refused "$WORK/float.idx: dtype float32: token ids must be integers \(uint8, int8, int16, uint16, int32, int64\)" \
  --format megatron --input "$WORK/float"
$FIX megatron "$WORK/past" --bad-pointer
refused "$WORK/past.idx: sequence [0-9]+ \([0-9]+ tokens at byte [0-9]+\) lies past the end of $WORK/past.bin \
\([0-9]+ bytes\): an index past the data, or a truncated .bin" \
  --format megatron --input "$WORK/past"
$FIX megatron "$WORK/cut"
truncate -s -4 "$WORK/cut.bin"
refused "$WORK/cut.idx: sequence [0-9]+ .*lies past the end of $WORK/cut.bin .*a truncated .bin" \
  --format megatron --input "$WORK/cut"
truncate -s -8 "$WORK/cut.idx"
refused "$WORK/cut.idx: truncated: [0-9]+ bytes, the header promises [0-9]+ sequences and [0-9]+ document starts" \
  --format megatron --input "$WORK/cut"
rm "$WORK/cut.bin"
refused "$WORK/cut.bin: missing: --format megatron takes a PREFIX with PREFIX.idx and PREFIX.bin" \
  --format megatron --input "$WORK/cut"
$FIX megatron "$WORK/big" --bad-id 300
refused "$WORK/big.bin: token id 300 at token [0-9]+ is outside the tokenizer's vocabulary \(vocab_size 300\)" \
  --format megatron --input "$WORK/big"

$FIX llmc "$WORK/magic.bin" --bad-magic
refused "$WORK/magic.bin: not an llm.c token file: bad magic 20240521 \(expected 20240520 or 20240801\)" \
  --format llmc --input "$WORK/magic.bin"
cp "$WORK/a.bin" "$WORK/cut.bin"
truncate -s -2 "$WORK/cut.bin"
refused "$WORK/cut.bin: truncated: [0-9]+ bytes, the header promises [0-9]+ uint16 tokens \([0-9]+ bytes\)" \
  --format llmc --input "$WORK/a.bin" "$WORK/cut.bin"
$FIX llmc "$WORK/big.bin" --bad-id 300
refused "$WORK/big.bin: token id 300 at token [0-9]+ is outside the tokenizer's vocabulary \(vocab_size 300\)" \
  --format llmc --input "$WORK/big.bin"
echo OK
