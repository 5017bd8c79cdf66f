# eval, export, sample and plot_metrics on freshly trained tiny runs:
#   eval under mpirun -np 2 and alone reproduces the trainer's final val_loss on the trainer's windows by
#   default, and --batches chooses another set;
#   tools/check_export.py rebuilds the exported HuggingFace GPT-2 and measures the same loss within 1e-4;
#   sample on a run whose corpus `yuanlm prep` made with a trained SentencePiece tokenizer is deterministic for a
#   seed and changes with the seed; greedy decoding is deterministic;
#   tools/plot_metrics.py draws a PNG of the run's metrics;
#   concurrent exports into one new directory leave it whole, each either succeeding or failing with one error
#   line naming it, and leave nothing beside it; a killed export's staging directory is removed by the next one;
#   an export into a directory holding an older one and a README, killed before it moves its files, leaves the old
#   set whole; killed among the moves, the next export first completes its set; the README stays;
#   a missing checkpoint, sampling a run without a tokenizer, or an eval or sample option past what the data or
#   the tokenizer allow is a one-line error and a non-zero exit (eval's micro-batch before anything its size is
#   allocated), given before the checkpoint's optimizer shards are read.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
run="$WORK/run"
train 2 "$run" --train.steps=12 --train.global_batch=8 --train.micro_batch=2 --train.eval_batches=4 \
  --data.val="$WORK/corpus/*.h5" >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; exit 1; }

# same_loss A B TOL: relative difference of two val_loss values (numbers or eval --json outputs) within TOL
same_loss() {
  $PY - "$@" <<'PYEOF'
import json, sys
def val(s):
    try:
        return float(s)
    except ValueError:
        return json.loads(open(s).read().splitlines()[-1])["val_loss"]
a, b, tol = val(sys.argv[1]), val(sys.argv[2]), float(sys.argv[3])
rel = abs(a - b) / abs(b)
print(f"val_loss {a!r} vs {b!r}: relative difference {rel:.2e} (tolerance {tol:g})")
sys.exit(0 if rel <= tol else 1)
PYEOF
}

echo "== eval under mpirun -np 2 and alone"
mpirun -np 2 bin/yuanlm eval --checkpoint "$run" --json >"$WORK/eval2.out"
cat "$WORK/eval2.out"
# last_json FILE KEY: KEY of the JSON object on FILE's last line
last_json() { $PY -c 'import json, sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])' "$@"; }
trained=$(last_json "$run/metrics.jsonl" val_loss)
same_loss "$WORK/eval2.out" "$trained" 1e-6
bin/yuanlm eval --checkpoint "$run/ckpt/step_0000012" --json >"$WORK/eval1.out"
tail -1 "$WORK/eval1.out"
same_loss "$WORK/eval1.out" "$WORK/eval2.out" 1e-6
[ "$(last_json "$WORK/eval1.out" windows)" = 16 ]
bin/yuanlm eval --checkpoint "$run" --batches 3 --json >"$WORK/eval3.out"
tail -1 "$WORK/eval3.out"
[ "$(last_json "$WORK/eval3.out" windows)" = 6 ]

echo "== export, and the loss of the export"
bin/yuanlm export --checkpoint "$run" --out "$WORK/hf"
$PY tools/check_export.py "$WORK/hf" --eval "$WORK/eval2.out"

echo "== concurrent exports into one new directory"
# Each round starts two exports at once (both wait for the same file) into a fresh directory. Either may lose the
# race for the final rename: then it says so in one line naming the directory. The directory ends up as the one
# export above wrote it, and nothing else is left beside it.
for round in 1 2 3 4 5; do
  out="$WORK/race$round/hf"
  mkdir "$WORK/race$round"
  pids=()
  for i in 0 1; do
    (until [ -e "$WORK/race$round.go" ]; do sleep 0.01; done
     exec bin/yuanlm export --checkpoint "$run" --out "$out") >"$WORK/race$round.$i" 2>&1 &
    pids+=($!)
  done
  touch "$WORK/race$round.go"
  for i in 0 1; do
    log="$WORK/race$round.$i" rc=0
    wait "${pids[$i]}" || rc=$?
    [ "$rc" = 0 ] && continue
    cat "$log"
    [ "$(wc -l <"$log")" -eq 1 ] && grep -qF "error: [rank 0@" "$log" && grep -qF -- "--out $out " "$log" &&
      ! grep -q "filesystem error" "$log" || { echo "round $round: a failed export did not say why in a line"; exit 1; }
  done
  diff -r "$WORK/hf" "$out" || { echo "round $round: $out differs from a lone export's"; exit 1; }
  [ "$(ls -A "$WORK/race$round")" = hf ] || { echo "round $round: beside $out:"; ls -A "$WORK/race$round"; exit 1; }
done
echo "exports raced in 5 rounds: $(cat "$WORK"/race?.? | grep -c "^error: ") lost the final rename"

echo "== a killed export's staging directory"
# Named .NAME.export-PID@HOST: a dead pid of this host is removed by the next export into NAME, a directory of
# another host (whose pids say nothing here) is left alone.
host=$(bin/yuanlm export --checkpoint "$WORK/nope" --out "$WORK/x" 2>&1 |
       sed -n 's/^error: \[rank 0@\([^]]*\)\].*/\1/p' || true)  # as yuanlm names it
sh -c 'exit 0' &
dead=$!
wait $dead
mkdir -p "$WORK/killed/.hf.export-$dead@$host" "$WORK/killed/.hf.export-1@elsewhere"
touch "$WORK/killed/.hf.export-$dead@$host/model.safetensors"
bin/yuanlm export --checkpoint "$run" --out "$WORK/killed/hf" >/dev/null
[ "$(ls -A "$WORK/killed" | LC_ALL=C sort | tr '\n' ' ')" = ".hf.export-1@elsewhere hf " ] ||
  { echo "after an export beside a dead one's staging directory:"; ls -A "$WORK/killed"; exit 1; }

echo "== plot_metrics"
$PY tools/plot_metrics.py "$run" -o "$WORK/metrics.png"
[ -s "$WORK/metrics.png" ] && [ "$(head -c 4 "$WORK/metrics.png" | tail -c 3)" = PNG ] || { echo "no PNG"; exit 1; }

echo "== sample from a run on a corpus prepared with a trained SentencePiece tokenizer"
$PY - "$WORK/text.txt" <<'PYEOF'
import random, sys
r = random.Random(3)
subj = ["the model", "every rank", "a small cat", "the loader", "our run"]
verb = ["reads", "writes", "sees", "trains on", "checks"]
obj = ["the shards", "a window", "its slice", "the tokens", "a checkpoint"]
with open(sys.argv[1], "w") as f:
    for d in range(120):
        f.write(" ".join(f"{r.choice(subj)} {r.choice(verb)} {r.choice(obj)}." for _ in range(8)) + "\n\n")
PYEOF
bin/yuanlm prep -i "$WORK/text.txt" --doc-sep blank --train-tokenizer --vocab-size 300 -o "$WORK/spm" \
  --val-fraction 0.1 >"$WORK/prep.log" 2>&1 || { cat "$WORK/prep.log"; exit 1; }
sprun="$WORK/sprun"
mpirun -np 2 bin/yuanlm train "${TINY[@]}" --model.vocab_size=300 --model.seq_len=32 --model.n_embd=64 --optim.lr=1e-2 \
  --data.train="$WORK/spm/train_*.h5" --run.dir="$sprun" --train.steps=120 --train.global_batch=16 \
  --train.micro_batch=4 >"$WORK/sptrain.log" 2>&1 || { cat "$WORK/sptrain.log"; exit 1; }
sample() { bin/yuanlm sample --checkpoint "$sprun" --prompt "the model" --tokens 40 "$@" 2>/dev/null; }
a=$(sample --seed 1) b=$(sample --seed 1) c=$(sample --seed 2) g1=$(sample --temperature 0) g2=$(sample --temperature 0)
k=$(sample --seed 1 --top-k 5)
printf 'seed 1: %s\nseed 1: %s\nseed 2: %s\ngreedy: %s\ntop-k 5: %s\n' "$a" "$b" "$c" "$g1" "$k"
[ "$a" = "$b" ] || { echo "same seed, different text"; exit 1; }
[ "$a" != "$c" ] || { echo "seeds 1 and 2 gave the same text"; exit 1; }
[ "$g1" = "$g2" ] || { echo "greedy decoding is not deterministic"; exit 1; }
for s in "$a" "$c" "$g1" "$k"; do
  case "$s" in "the model"?*) ;; *) echo "sample does not continue the prompt: '$s'"; exit 1 ;; esac
done
bin/yuanlm export --checkpoint "$sprun" --out "$WORK/sphf" >/dev/null
[ -s "$WORK/sphf/tokenizer.model" ] && grep -q '"eos_token_id": 2,' "$WORK/sphf/config.json" ||
  { cat "$WORK/sphf/config.json"; echo "export lacks the tokenizer or its eot id"; exit 1; }

echo "== an export into a directory holding another export and a README, killed half-way"
# Every file is written and flushed beside the directory before any is moved in. Killed before the first move
# (YUANLM_EXPORT_KILL_AT=staged), the old set is there whole; killed among the moves (=moving: after the first, in
# name order config.json), the directory holds both, and the next export into it, even one killed itself, first
# moves the rest of that complete set in. The README stays throughout; nothing is left beside the directory.
both="$WORK/both"
mkdir "$both" && echo keep >"$both/README.md"
bin/yuanlm export --checkpoint "$run" --out "$both" >/dev/null
# is_set REF: $both holds every file of the export REF, byte for byte, and the README
is_set() {
  local f
  for f in $(ls -A "$1"); do cmp -s "$1/$f" "$both/$f" || return 1; done
  [ "$(cat "$both/README.md")" = keep ]
}
# killed_export AT CHECKPOINT: an export into $both, SIGKILLed at AT
killed_export() {
  local rc=0
  YUANLM_EXPORT_KILL_AT=$1 bin/yuanlm export --checkpoint "$2" --out "$both" >/dev/null 2>"$WORK/killed.err" || rc=$?
  [ "$rc" = 137 ] || { cat "$WORK/killed.err"; echo "export with YUANLM_EXPORT_KILL_AT=$1 ended with $rc"; exit 1; }
}
killed_export staged "$sprun"
is_set "$WORK/hf" && [ ! -e "$both/tokenizer.model" ] || { ls -A "$both"; echo "not the old set after a kill"; exit 1; }
killed_export moving "$sprun"
cmp -s "$WORK/sphf/config.json" "$both/config.json" && cmp -s "$WORK/hf/model.safetensors" "$both/model.safetensors" ||
  { echo "YUANLM_EXPORT_KILL_AT=moving did not stop after config.json"; exit 1; }
killed_export staged "$run"
grep -qF "warning: export: finished moving the files of an export into $both that was killed half-way" \
  "$WORK/killed.err" || { cat "$WORK/killed.err"; echo "no warning of the roll-forward"; exit 1; }
is_set "$WORK/sphf" || { ls -A "$both"; echo "the set of the export killed among its moves is not whole"; exit 1; }
bin/yuanlm export --checkpoint "$run" --out "$both" >/dev/null
is_set "$WORK/hf" || { echo "an export after the kills is not whole"; exit 1; }
[ "$(ls -A "$WORK" | grep -c '^\.both\.')" -eq 0 ] || { ls -A "$WORK"; echo "left beside $both"; exit 1; }

echo "== bad input"
# expect_error "MESSAGE" COMMAND...: fails, and stderr is the one line "error: [rank 0@host] ...MESSAGE..."
expect_error() {
  local want=$1
  shift
  if "$@" >/dev/null 2>"$WORK/err"; then echo "expected '$*' to fail"; exit 1; fi
  cat "$WORK/err"
  [ "$(wc -l <"$WORK/err")" -eq 1 ] && grep -qF "$want" "$WORK/err" ||
    { echo "expected one line with '$want'"; exit 1; }
}
expect_error "'$WORK/nope' is neither a checkpoint" bin/yuanlm eval --checkpoint "$WORK/nope"
expect_error "'$WORK/nope' is neither a checkpoint" bin/yuanlm sample --checkpoint "$WORK/nope" --prompt hi
expect_error "'$WORK/nope' is neither a checkpoint" bin/yuanlm export --checkpoint "$WORK/nope" --out "$WORK/x"
expect_error "checkpoint $run/ckpt/step_0000012 has no tokenizer: its training shards had no manifest.json" \
  bin/yuanlm sample --checkpoint "$run" --prompt hi
expect_error "eval: the option '--checkpoint' is required but missing" bin/yuanlm eval
# A micro-batch past the validation set is refused before its buffers (gigabytes here) are allocated.
start=$SECONDS
want="holds 498 windows of 17 tokens, fewer than one micro-batch reads (--micro-batch 100000000 x 1 reader = 100000000"
expect_error "$want windows): give --micro-batch <= 498" bin/yuanlm eval --checkpoint "$run" --micro-batch 100000000
[ $((SECONDS - start)) -lt 5 ] || { echo "eval took $((SECONDS - start)) s to refuse --micro-batch"; exit 1; }
expect_error "(--batches 2000000000 x 2 sequences x 1 reader = 4000000000 windows): give --batches <= 249" \
  bin/yuanlm eval --checkpoint "$run" --batches 2000000000
expect_error "eval: --micro-batch must be >= 1 (got 0)" bin/yuanlm eval --checkpoint "$run" --micro-batch 0
expect_error "sample: --top-k 301 is more than the 300 ids of tokenizer" \
  bin/yuanlm sample --checkpoint "$sprun" --prompt hi --top-k 301
expect_error "sample: --temperature must be a finite number >= 0 (got -1)" \
  bin/yuanlm sample --checkpoint "$sprun" --prompt hi --temperature -1
expect_error "sample: --tokens must be >= 1 (got 0)" bin/yuanlm sample --checkpoint "$sprun" --prompt hi --tokens 0
expect_error "sample: --tokens 3201 is more than 3200, 100 times the model's context (seq_len 32) of checkpoint" \
  bin/yuanlm sample --checkpoint "$sprun" --prompt hi --tokens 3201

echo "== options refused without reading the checkpoint's shards"
# fifo_copy RUN DIR: RUN's newest checkpoint copied as DIR, its first optimizer shard a FIFO: reading it blocks
fifo_copy() {
  cp -r "$1/ckpt/$(cat "$1/ckpt/latest")" "$2"
  local shard
  shard=$(ls "$2"/optim_*.safetensors | head -1)
  rm "$shard"
  mkfifo "$shard"
}
fifo_copy "$run" "$WORK/fifo_run"
fifo_copy "$sprun" "$WORK/fifo_sprun"
rc=0
timeout -k 1 2 bin/yuanlm eval --checkpoint "$WORK/fifo_run" >/dev/null 2>&1 || rc=$?
[ "$rc" = 124 ] || [ "$rc" = 137 ] || { echo "eval with good options ended ($rc), not blocked by the FIFO"; exit 1; }
# unblocked COMMAND...: COMMAND, killed after 10 s with a line saying so
unblocked() {
  local rc=0
  timeout -k 1 10 "$@" || rc=$?
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || echo "still running after 10 s (reading a shard?): $*" >&2
  return "$rc"
}
expect_error "$want windows): give --micro-batch <= 498" \
  unblocked bin/yuanlm eval --checkpoint "$WORK/fifo_run" --micro-batch 100000000
expect_error "give --batches <= 249" unblocked bin/yuanlm eval --checkpoint "$WORK/fifo_run" --batches 2000000000
expect_error "sample: --top-k 301 is more than the 300 ids of tokenizer" \
  unblocked bin/yuanlm sample --checkpoint "$WORK/fifo_sprun" --prompt hi --top-k 301
echo "OK"
