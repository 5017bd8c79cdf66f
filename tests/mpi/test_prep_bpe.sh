# GPT-2-style byte-level BPE end to end, with the tokenizer of tests/data/bpe (tools/make_bpe_fixture.py):
#   `yuanlm prep --tokenizer` given GPT-2's merges.txt (its vocab.json found beside it) and given the HF
#   tokenizer.json make the same token ids, an eot before every document, and store one tokenizer.json named by
#   its sha256;
#   a model trained on that corpus carries the tokenizer into its checkpoint, and `yuanlm sample` encodes the
#   prompt and decodes the continuation through it (the same text for the same seed);
#   a tokenizer.json that is not byte-level BPE is a one-line error naming the file and the key.
source "$(dirname "$0")/lib.sh"
$PY - "$WORK/text.txt" <<'PYEOF'
import random, sys
r = random.Random(3)
subj = ["the model", "every rank", "a small cat", "the loader", "our run", "床前明月光"]
verb = ["reads", "writes", "sees", "trains on", "checks"]
obj = ["the shards", "a window", "its slice", "the tokens", "a checkpoint", "地上霜"]
with open(sys.argv[1], "w") as f:
    for d in range(120):
        f.write(" ".join(f"{r.choice(subj)} {r.choice(verb)} {r.choice(obj)}." for _ in range(8)) + "\n\n")
PYEOF
for form in merges.txt tokenizer.json; do
  bin/yuanlm prep -i "$WORK/text.txt" --doc-sep blank --tokenizer "tests/data/bpe/$form" -o "$WORK/$form" \
    --val-fraction 0.1 >"$WORK/prep.log" 2>&1 || { cat "$WORK/prep.log"; exit 1; }
  tail -2 "$WORK/prep.log"
done
$PY - "$WORK/merges.txt" "$WORK/tokenizer.json" <<'PYEOF'
import glob, hashlib, json, sys
import h5py, numpy as np
tokens = []
for out in sys.argv[1:]:
    m = json.load(open(f"{out}/manifest.json"))
    assert m["tokenizer_file"] == "tokenizer.json", m["tokenizer_file"]
    assert m["tokenizer"] == "bpe:sha256:" + hashlib.sha256(open(f"{out}/tokenizer.json", "rb").read()).hexdigest()
    assert m["eot_id"] == 0 and m["vocab_size"] == 800, m
    t = np.concatenate([h5py.File(f, "r")["tokens"][:] for f in sorted(glob.glob(f"{out}/*.h5"))])
    assert (t == 0).sum() == 120, (t == 0).sum()  # one eot per document
    tokens.append(t)
assert (tokens[0] == tokens[1]).all(), "merges.txt and tokenizer.json made different ids"
print("both forms: the same", len(tokens[0]), "tokens, 120 documents")
PYEOF

run="$WORK/run"
mpirun -np 1 bin/yuanlm train "${TINY[@]}" --model.vocab_size=800 --model.seq_len=32 --optim.lr=1e-2 \
  --data.train="$WORK/merges.txt/train_*.h5" --run.dir="$run" --train.steps=20 --train.global_batch=8 \
  --train.micro_batch=4 >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; exit 1; }
ls "$run"/ckpt/step_*/tokenizer.json
sample() { bin/yuanlm sample --checkpoint "$run" --prompt "the model 床前" --tokens 20 "$@" 2>/dev/null; }
a=$(sample --seed 1) b=$(sample --seed 1)
printf 'seed 1: %s\nseed 1: %s\n' "$a" "$b"
[ "$a" = "$b" ] || { echo "same seed, different text"; exit 1; }
case "$a" in "the model 床前"?*) ;; *) echo "sample does not continue the prompt: '$a'"; exit 1 ;; esac
# export writes the tokenizer under the name HuggingFace's GPT-2 tokenizer loads it by, byte for byte.
bin/yuanlm export --checkpoint "$run" --out "$WORK/hf" >/dev/null 2>&1 || { echo "export failed"; exit 1; }
cmp "$WORK/hf/tokenizer.json" "$WORK/merges.txt/tokenizer.json" || { echo "export: no tokenizer.json"; exit 1; }

$PY -c 'import json, sys; t = json.load(open(sys.argv[1])); t["model"]["type"] = "WordPiece"
json.dump(t, open(sys.argv[2], "w"))' tests/data/bpe/tokenizer.json "$WORK/wordpiece.json"
if bin/yuanlm prep -i "$WORK/text.txt" --tokenizer "$WORK/wordpiece.json" -o "$WORK/wp" >/dev/null 2>"$WORK/err"; then
  echo "prep accepted a WordPiece tokenizer.json"
  exit 1
fi
cat "$WORK/err"
want="$WORK/wordpiece.json: .model.type: expected BPE, found \"WordPiece\""
[ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -qF "$want" "$WORK/err" ||
  { echo "expected one line naming the file and .model.type"; exit 1; }
[ ! -e "$WORK/wp" ] || { echo "a refused prep left $WORK/wp"; exit 1; }
echo "PASS"
