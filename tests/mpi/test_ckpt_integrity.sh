# Checkpoints are checked wherever they are read, and a run directory's checkpoints are never lost to a later run
# (issue 21, data-loss cases 2 and 4):
#   ckpt.resume=none in a run dir that holds checkpoints is refused before anything is written; the run's
#   checkpoints, metrics and config stay as they were, eval and auto-resume still work;
#   a run resumed with ckpt.resume=DIR from an older step keeps its own newest checkpoints through rotation, and
#   auto-resume continues it rather than the abandoned timeline's higher steps;
#   a flipped byte in an optimizer shard: eval, export, sample and ckpt.resume=DIR refuse with one line naming the
#   file; a state.json missing a shard's entry, with an edited offset or count, or any other edit: refused naming
#   the checkpoint and what is wrong, and auto-resume skips it for the one before; one without its own sha256 (an
#   older checkpoint) is read with a warning; an empty or unparsable state.json is named and skipped by auto-resume;
#   shards made by another tokenizer than the checkpoint's: resuming and eval refuse, naming both.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
small=(--train.global_batch=4 --train.micro_batch=2 --data.val="$WORK/corpus/*.h5" --train.eval_batches=1)
R="$WORK/R"
ck() { printf '%s/ckpt/step_%07d' "${2:-$R}" "$1"; }

# ok COMMAND...: succeeds; its output is in $WORK/log
ok() { "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; echo "failed: $*"; exit 1; }; }
# refused WANT COMMAND...: fails, and its output holds exactly one "error: " line, which contains WANT
refused() {
  local want=$1
  shift
  if "$@" >"$WORK/log" 2>&1; then cat "$WORK/log"; echo "expected to fail: $*"; exit 1; fi
  grep "^error: " "$WORK/log" >"$WORK/err" || true
  cat "$WORK/err"
  [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -qF -- "$want" "$WORK/err" ||
    { cat "$WORK/log"; echo "expected one error line containing: $want"; exit 1; }
}
# edit_state DIR PYTHON: runs PYTHON on s, DIR/state.json parsed, and writes it back
edit_state() {
  $PY - "$@" <<'PYEOF'
import json, sys
path = sys.argv[1] + "/state.json"
s = json.load(open(path))
shard = lambda name: next(f for f in s["files"] if f["name"] == name)
exec(sys.argv[2])
json.dump(s, open(path, "w"), indent=2)
PYEOF
}
# snapshot: what must survive a refused run in $R
snapshot() { (ls "$R/ckpt" && cat "$R/ckpt/latest" "$R/metrics.jsonl" "$R/config.ini") | sha256sum; }

echo "== case 2: ckpt.resume=none into a run dir with checkpoints"
ok train 2 "$R" "${small[@]}" --train.steps=30 --ckpt.every=10
before=$(snapshot)
refused "run.dir $R already holds checkpoints (the newest is $(ck 30)) and ckpt.resume=none would start over" \
  train 2 "$R" "${small[@]}" --train.steps=8 --ckpt.every=2 --ckpt.resume=none
[ "$(snapshot)" = "$before" ] || { echo "the refused run changed $R"; exit 1; }
ok bin/yuanlm eval --checkpoint "$R"
grep -F "eval $(ck 30) (step 30)" "$WORK/log"
ok train 2 "$R" "${small[@]}" --train.steps=32 --ckpt.every=10
grep -F "resumed from $(ck 30)" "$WORK/log"

echo "== ckpt.resume=DIR from an older step: rotation keeps the new run's newest, auto-resume continues it"
ok train 2 "$R" "${small[@]}" --train.steps=26 --ckpt.every=2 --ckpt.resume="$(ck 20)"
grep -F "resumed from $(ck 20)" "$WORK/log"
[ "$(ls "$R/ckpt" | tr '\n' ' ')" = "latest step_0000022 step_0000024 step_0000026 " ] &&
  [ "$(cat "$R/ckpt/latest")" = step_0000026 ] || { ls "$R/ckpt"; cat "$R/ckpt/latest"; exit 1; }
ok train 2 "$R" "${small[@]}" --train.steps=28
grep -F "resumed from $(ck 26)" "$WORK/log"

echo "== case 4: a flipped byte in an optimizer shard"
F="$WORK/flipped"
cp -r "$(ck 28)" "$F"
$PY -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-100] ^= 0x10; open(p, "wb").write(b)' \
  "$F/optim_00001_000.safetensors"
bad="$F/optim_00001_000.safetensors does not match its checksum"
refused "$bad" bin/yuanlm eval --checkpoint "$F"
refused "$bad" bin/yuanlm export --checkpoint "$F" --out "$WORK/hf"
[ ! -e "$WORK/hf/model.safetensors" ] || { echo "export wrote the corrupt weights"; exit 1; }
refused "$bad" bin/yuanlm sample --checkpoint "$F" --prompt hi
refused "ckpt.resume=$F: $bad" train 2 "$WORK/other" "${small[@]}" --train.steps=32 --ckpt.resume="$F"
[ ! -e "$WORK/other/ckpt" ] && [ ! -e "$WORK/other/metrics.jsonl" ] || { echo "the refused run wrote"; exit 1; }

echo "== case 4: state.json edited"
# edited NAME PYTHON: a copy of step 28 as $WORK/NAME, its state.json edited by PYTHON
edited() { rm -rf "${WORK:?}/$1"; cp -r "$(ck 28)" "$WORK/$1"; edit_state "$WORK/$1" "$2"; }
what() { echo "checkpoint $WORK/$1: state.json"; }
edited gone 's["files"].remove(shard("optim_00001_000.safetensors"))'
refused "$(what gone): no optimizer shard holds h.0." bin/yuanlm eval --checkpoint "$WORK/gone"
refused "ckpt.resume=$WORK/gone: $(what gone): no optimizer shard holds h.0." \
  train 2 "$WORK/other" "${small[@]}" --train.steps=32 --ckpt.resume="$WORK/gone"
edited offset 'shard("optim_00001_000.safetensors")["offset"] -= 16'
refused "$(what offset): files 'optim_00000_000.safetensors' and 'optim_00001_000.safetensors' both hold h.0." \
  bin/yuanlm export --checkpoint "$WORK/offset" --out "$WORK/hf"
edited count 'shard("optim_00001_000.safetensors")["count"] -= 16'
refused "$(what count): no optimizer shard holds ln_f.bias" bin/yuanlm sample --checkpoint "$WORK/count" --prompt hi
edited sample 's["next_sample"] += 4'
refused "$(what sample) does not match its own sha256" bin/yuanlm eval --checkpoint "$WORK/sample"
edited older 'del s["sha256"]'
ok bin/yuanlm eval --checkpoint "$WORK/older"
grep -F "warning: checkpoint $WORK/older: state.json has no sha256 of its own" "$WORK/log"
edited older_gone 'del s["sha256"]; s["files"].remove(shard("optim_00000_000.safetensors"))'
refused "$(what older_gone): no optimizer shard holds wte.weight (value 0 of" bin/yuanlm eval --checkpoint "$WORK/older_gone"
edit_state "$(ck 28)" 's["next_sample"] += 4'
ok train 2 "$R" "${small[@]}" --train.steps=30
grep -F "warning: skipping checkpoint $(ck 28): checkpoint $(ck 28): state.json does not match its own sha256" \
  "$WORK/log"
grep -F "resumed from $(ck 26)" "$WORK/log"

echo "== an empty or unparsable state.json: auto-resume names it and takes the one before"
Z=$WORK/Z
ok train 2 "$Z" "${small[@]}" --train.steps=6 --ckpt.every=2
: >"$(ck 6 "$Z")/state.json"
printf '{"step": ' >"$(ck 4 "$Z")/state.json"
ok train 2 "$Z" "${small[@]}" --train.steps=8 --ckpt.every=2
for want in "skipping checkpoint $(ck 6 "$Z"): $(ck 6 "$Z")/state.json is empty (0 bytes)" \
            "skipping checkpoint $(ck 4 "$Z"): $(ck 4 "$Z")/state.json is not JSON" "resumed from $(ck 2 "$Z")"; do
  grep -qF -- "$want" "$WORK/log" || { cat "$WORK/log"; echo "no '$want'"; exit 1; }
done

echo "== shards of another tokenizer"
# tok_corpus DIR NAME: the corpus as `yuanlm prep` would label it, made by a tokenizer file holding NAME
tok_corpus() {
  mkdir -p "$1"
  cp "$WORK"/corpus/*.h5 "$1"
  printf '%s' "$2" >"$1/tok.model"
  $PY - "$1" <<'PYEOF'
import glob, hashlib, h5py, json, sys
d = sys.argv[1]
name = "sentencepiece:sha256:" + hashlib.sha256(open(d + "/tok.model", "rb").read()).hexdigest()
for p in glob.glob(d + "/*.h5"):
    with h5py.File(p, "r+") as f:
        f.attrs["tokenizer"] = name
json.dump({"tokenizer": name, "tokenizer_file": "tok.model"}, open(d + "/manifest.json", "w"))
PYEOF
}
tok_corpus "$WORK/a" one
tok_corpus "$WORK/b" two
T="$WORK/T"
tok_train() { mpirun -np 2 bin/yuanlm train "${TINY[@]}" --run.dir="$T" "${small[@]}" "$@"; }
ok tok_train --data.train="$WORK/a/*.h5" --train.steps=4
sum_a=$(sha256sum <"$WORK/a/tok.model" | cut -d' ' -f1)
sum_b=$(sha256sum <"$WORK/b/tok.model" | cut -d' ' -f1)
mismatch="$WORK/b/shard_000.h5 was made by tokenizer 'sentencepiece:sha256:$sum_b', checkpoint $(ck 4 "$T") by \
$(ck 4 "$T")/tokenizer.model (sha256:$sum_a)"
refused "$mismatch" tok_train --data.train="$WORK/b/*.h5" --train.steps=6
refused "$mismatch" bin/yuanlm eval --checkpoint "$T" --data "$WORK/b/*.h5"
ok bin/yuanlm eval --checkpoint "$T" --data "$WORK/a/*.h5"
ok bin/yuanlm eval --checkpoint "$T" --data "$WORK/corpus/*.h5"  # no tokenizer named: accepted
echo "OK"
