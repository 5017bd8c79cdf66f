#!/usr/bin/env bash
# `yuanlm prep` never loses the corpus it replaces (issue 21, data-loss case 1): a prep that fails (a missing
# tokenizer, input that is not text) or is killed leaves the previous corpus in --out byte for byte as it was, and
# nothing beside it; input that is not UTF-8 text is refused naming the file and byte offset, input of whitespace
# alone as holding no documents; a successful prep replaces the corpus whole, with no shard of the old one left; a
# full file system under --out is one error line with the system's reason, naming the file.
source "$(dirname "$0")/lib.sh"

# text FILE LINES: seeded sentences of English and Chinese words, a document per line.
text() {
  $PY - "$@" <<'PYEOF'
import random, sys
rng = random.Random(3)
words = ("the model reads tokens from shards and every rank takes its slice of a window "
         "学习 数据 模型 床前 明月光").split()
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(4, 30))) + "\n")
PYEOF
}

X=$WORK/x
text "$WORK/text.txt" 400
bin/yuanlm prep --input "$WORK/text.txt" --train-tokenizer --vocab-size 400 --shard-tokens 2000 --out "$X" \
  >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
[ -f "$X/train_00003.h5" ] || { echo "expected several train shards:"; ls "$X"; exit 1; }
cp -a "$X" "$WORK/before"

# nothing_beside WHAT: no directory of an unfinished prep is left beside X.
nothing_beside() {
  local left
  left=$(ls -A "$WORK" | grep '^\.x\.' || true)
  [ -z "$left" ] || { echo "$1 left $left beside $X"; exit 1; }
}

# unchanged WHAT: X holds exactly the files it held before, byte for byte, and nothing is left beside it.
unchanged() {
  diff -r "$WORK/before" "$X" || { echo "$1 changed $X"; exit 1; }
  nothing_beside "$1"
}

# refused PATTERN ARGS...: prep ARGS fails with one line "error: ...PATTERN" (an extended regexp), X unchanged.
refused() {
  local pattern=$1
  shift
  if bin/yuanlm prep "$@" >"$WORK/log" 2>&1; then echo "prep $* succeeded"; cat "$WORK/log"; exit 1; fi
  grep -Eq "^error: .*$pattern" "$WORK/log" && [ "$(grep -c . "$WORK/log")" = 1 ] ||
    { echo "prep $*: expected one line 'error: ...$pattern', got:"; cat "$WORK/log"; exit 1; }
  unchanged "prep $*"
  echo "ok: $(cat "$WORK/log")"
}

# The issue's case exactly.
refused "/nonexistent.model: cannot open tokenizer" --input README.md --tokenizer /nonexistent.model --out "$X"
# Binary input, with the corpus's own tokenizer and with a tokenizer to train: file and byte offset named.
gzip -c README.md >"$WORK/readme.gz"  # starts 1f 8b: 0x8b at offset 1 is no UTF-8
refused "$WORK/readme.gz: not UTF-8 text: an invalid sequence at byte offset 1 \(line 1\), starting 0x8B" \
  --input "$WORK/text.txt" "$WORK/readme.gz" --tokenizer "$X/tokenizer.model" --out "$X"
refused "/bin/true: not UTF-8 text: a NUL byte at byte offset [0-9]+ " \
  --input /bin/true --train-tokenizer --vocab-size 400 --out "$X"
# Whitespace alone is no document: such input is refused as empty input is, not made a corpus of blank documents.
printf '  \n\n \t\n' >"$WORK/blank.txt"
refused "prep: the input \($WORK/blank.txt \.\.\.\) holds no documents" \
  --input "$WORK/blank.txt" --tokenizer "$X/tokenizer.model" --out "$X"
refused "prep: $WORK/blank.txt: no text to train the tokenizer on" \
  --input "$WORK/blank.txt" --train-tokenizer --vocab-size 400 --out "$X"

# Killed (kill -9) while writing the new corpus: X unchanged; the next prep removes what it left, saying so.
text "$WORK/big.txt" 300000
bin/yuanlm prep --input "$WORK/big.txt" --tokenizer "$X/tokenizer.model" --threads 1 --out "$X" \
  >"$WORK/killed.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  compgen -G "$WORK/.x.tmp-$pid@*/train_00000.h5*" >/dev/null && break
  sleep 0.1
done
compgen -G "$WORK/.x.tmp-$pid@*/train_00000.h5*" >/dev/null || { echo "prep never started writing"; exit 1; }
kill -9 $pid
{ wait $pid; } 2>/dev/null && { echo "prep finished before it was killed"; exit 1; }
diff -r "$WORK/before" "$X" || { echo "a killed prep changed $X"; exit 1; }

# A successful prep replaces X whole: fewer, larger shards from more input, and no shard of the old corpus left.
bin/yuanlm prep --input "$WORK/text.txt" README.md --tokenizer "$X/tokenizer.model" --shard-tokens 100000 \
  --out "$X" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "^prep: removed $WORK/.x.tmp-$pid@.*, left by a prep that did not finish" "$WORK/log" ||
  { echo "the killed prep's directory was not reported removed:"; cat "$WORK/log"; exit 1; }
nothing_beside "the prep after the killed one"
$PY - "$X" <<'PYEOF'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
listed = {s["file"]: s["sha256"] for split in ("train", "val") for s in m[split]}
assert len(m["train"]) == 1 and len(m["sources"]) == 2, m
sha = lambda f: hashlib.sha256(open(f"{d}/{f}", "rb").read()).hexdigest()
assert m["tokenizer"].endswith(sha(m["tokenizer_file"])), m["tokenizer_file"]
files = set(os.listdir(d))
assert files == set(listed) | {"manifest.json", m["tokenizer_file"]}, files
for f, s in listed.items():
    assert sha(f) == s, f
print("ok: re-prep replaced the corpus whole:", sorted(files))
PYEOF

# A full file system under --out: one error line with the system's reason, naming the file, and nothing left but
# the corpus already there. Into an empty one writing the shard data fails (and with it HDF5's closing of the file);
# beside an earlier corpus creating the next shard does.
full=$WORK/full
mkdir "$full"
trap 'umount "$full" 2>/dev/null; rm -rf "$WORK"' EXIT
# full_refused ARGS...: prep of big.txt with ARGS into $full/x fails with rc 1 and the one line.
full_refused() {
  local rc
  set +e
  bin/yuanlm prep --input "$WORK/big.txt" --tokenizer "$X/tokenizer.model" "$@" --out "$full/x" >"$WORK/log" 2>&1
  rc=$?
  set -e
  [ "$rc" = 1 ] && grep -Eq "^error: .*$full/\.x\.tmp-[0-9]+@[^/]*/[^ ]+: .*No space left on device" "$WORK/log" &&
    [ "$(grep -c . "$WORK/log")" = 1 ] ||
    { echo "prep onto a full file system: expected rc 1 and one line 'error: FILE: ...No space left on device'," \
        "got rc $rc:"
      cat "$WORK/log"; exit 1; }
  echo "ok: $(cat "$WORK/log")"
}
if mount -t tmpfs -o size=64k tmpfs "$full" 2>"$WORK/mount.log"; then
  full_refused --shard-tokens 100000
  [ -z "$(ls -A "$full")" ] || { echo "prep onto a full file system left $(ls -A "$full") in $full"; exit 1; }
  head -50 "$WORK/text.txt" >"$WORK/small.txt"
  bin/yuanlm prep --input "$WORK/small.txt" --tokenizer "$X/tokenizer.model" --shard-tokens 2000 --out "$full/x" \
    >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  cp -a "$full/x" "$WORK/full_before"
  full_refused --shard-tokens 20000
  diff -r "$WORK/full_before" "$full/x" || { echo "prep onto a full file system changed $full/x"; exit 1; }
  [ "$(ls -A "$full")" = x ] || { echo "prep onto a full file system left $(ls -A "$full") in $full"; exit 1; }
else
  echo "(not checked: no tmpfs can be mounted here: $(cat "$WORK/mount.log"))"
fi
echo OK
