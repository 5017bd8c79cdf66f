# Inputs that used to be accepted silently or answered with a misleading message: each is refused with a non-zero
# exit and one line naming the key, option or file and what was expected, and nothing is written where it was
# refused (the library checks are unit-tested in tests/test_config.cpp, test_layout.cpp and test_loader.cpp).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
make_corpus "$WORK/small" 1 100 64  # 6 windows of 17 tokens
args=("${TINY[@]}" --data.train="$WORK/corpus/*.h5" --train.global_batch=4 --train.micro_batch=2 --train.steps=2)

# expect_error NP MESSAGE COMMAND...: fails (not by the timeout) with MESSAGE on an error line; NP 0 runs COMMAND
# alone, where the error must be the only line on stderr.
expect_error() {
  local np=$1 want=$2
  shift 2
  echo "== $*"
  set +e
  if [ "$np" -eq 0 ]; then
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/log"
  else
    timeout 60 mpirun -np "$np" "$@" >"$WORK/out" 2>"$WORK/log"
  fi
  local rc=$?
  set -e
  grep '^error:' "$WORK/log" || true
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failing exit, got $rc"; cat "$WORK/log"; exit 1; }
  grep '^error:' "$WORK/log" | grep -qF -- "$want" || { echo "expected: $want"; cat "$WORK/log"; exit 1; }
  [ "$np" -ne 0 ] || [ "$(wc -l <"$WORK/log")" -eq 1 ] || { echo "expected one line on stderr"; exit 1; }
}
# expect_error_once NP MESSAGE COMMAND...: expect_error, and the error is printed once, not once per rank, and no
# rank aborted the job.
expect_error_once() {
  expect_error "$@"
  [ "$(grep -c '^error:' "$WORK/log")" -eq 1 ] && ! grep -q MPI_ABORT "$WORK/log" ||
    { echo "expected one error line and no MPI_ABORT"; cat "$WORK/log"; exit 1; }
}

echo "== a run to evaluate, sample and export"
run=$WORK/run
mpirun -np 2 bin/yuanlm train "${args[@]}" --run.dir="$run" --data.val="$WORK/small/*.h5" --train.eval_batches=1 \
  >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; exit 1; }
ckpt=$run/ckpt/step_0000002

# 1. A validation set smaller than one evaluation: 8 batches x 2 sequences x 2 ranks = 32 windows of the 6.
expect_error 2 "data.val = $WORK/small/*.h5 holds 6 windows of 17 tokens, fewer than one evaluation reads (train.eval_batches 8 x 2 sequences x 2 readers = 32 windows): give train.eval_batches <= 1" \
  bin/yuanlm train "${args[@]}" --run.dir="$WORK/small_val" --data.val="$WORK/small/*.h5" --train.eval_batches=8
[ ! -e "$WORK/small_val" ] || { echo "the refused run wrote $WORK/small_val"; exit 1; }
expect_error 0 "data.val = $WORK/small/*.h5 holds 6 windows of 17 tokens, fewer than one evaluation reads (--batches 4 x 2 sequences x 1 reader = 8 windows): give --batches <= 3" \
  bin/yuanlm eval --checkpoint "$run" --batches 4

# 2. A deck that is a directory.
expect_error 0 "deck input is a directory, expected an INI file" bin/yuanlm train input

# 3. Micro-batches without pipelines, or twice for one template; a template defined twice in one deck.
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
expect_error 0 "parallel.microbatches = two:2 needs parallel.pipelines" \
  bin/yuanlm plan "${args[@]}" "$two" --parallel.microbatches=two:2
expect_error 0 "parallel.microbatches = two:1,two:1: template 'two' is given micro-batches twice" \
  bin/yuanlm plan "${args[@]}" "$two" --parallel.pipelines=two --parallel.microbatches=two:1,two:1
printf '[parallel]\ntemplate = two: auto:2\ntemplate = two: auto:1\n' >"$WORK/twice.ini"
expect_error 0 "$WORK/twice.ini: parallel.template 'two' is defined twice" bin/yuanlm train "$WORK/twice.ini"

# 4. eval --batches 0 (0 was taken for "the default"), sample --seed -1 (was 2^64-1).
expect_error 0 "eval: --batches must be >= 1 (got 0)" bin/yuanlm eval --checkpoint "$run" --batches 0
expect_error 0 "sample: --seed must be a non-negative integer (got '-1')" \
  bin/yuanlm sample --checkpoint "$run" --seed -1

# 5. An empty --data.val= turns evaluation off, as the help says; an empty number names its key.
mpirun -np 2 bin/yuanlm train "${args[@]}" --run.dir="$WORK/noval" --data.val= >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; exit 1; }
grep -q "^val: none (data.val is empty)" "$WORK/log" || { cat "$WORK/log"; echo "evaluation not off"; exit 1; }
expect_error 0 "model.n_layer: '' is not an integer" bin/yuanlm train "${args[@]}" --model.n_layer=

# 6. Non-finite numbers, whatever the command.
expect_error 0 "sample: --temperature must be a finite number >= 0 (got nan)" \
  bin/yuanlm sample --checkpoint "$run" --temperature nan
expect_error 0 "prep: --val-fraction must be a finite number (got 'inf')" \
  bin/yuanlm prep --input README.md --out "$WORK/prep" --val-fraction inf

# 7. Ranks with different configs name the first key that differs and both values.
expect_error 1 "the resolved config differs between ranks: optim.lr = '0.01' on rank 1@" \
  bin/yuanlm train "${args[@]}" --run.dir="$WORK/mismatch" : -np 1 bin/yuanlm train "${args[@]}" \
  --run.dir="$WORK/mismatch" --optim.lr=1e-2
grep -qF "'0.003' on rank 0@" "$WORK/log" || { echo "rank 0's value is not named"; exit 1; }
# Compared before validation: a value only rank 1 refuses left rank 0 waiting for it.
expect_error 1 "the resolved config differs between ranks: optim.lr = '-1' on rank 1@" \
  bin/yuanlm train "${args[@]}" --run.dir="$WORK/mismatch" : -np 1 bin/yuanlm train "${args[@]}" \
  --run.dir="$WORK/mismatch" --optim.lr=-1

# 8. export into a checkpoint, or a directory holding one, is refused before anything is written; a good export
# leaves no staging directory and keeps the other files of an existing directory.
before=$(ls -A "$ckpt" "$run")
expect_error 0 "export: --out $ckpt is the checkpoint $ckpt" bin/yuanlm export --checkpoint "$ckpt" --out "$ckpt"
expect_error 0 "export: --out $ckpt/hf is inside the checkpoint $ckpt" \
  bin/yuanlm export --checkpoint "$ckpt" --out "$ckpt/hf"
expect_error 0 "export: --out $run holds the checkpoint $ckpt" bin/yuanlm export --checkpoint "$run" --out "$run"
[ "$(ls -A "$ckpt" "$run")" = "$before" ] || { echo "a refused export wrote into the run"; ls -A "$ckpt" "$run"; exit 1; }
mkdir "$WORK/hf" && echo keep >"$WORK/hf/README.md"
bin/yuanlm export --checkpoint "$run" --out "$WORK/hf/" >/dev/null
[ "$(ls -A "$WORK/hf" | tr '\n' ' ')" = "README.md config.json model.safetensors " ] &&
  [ "$(ls -A "$WORK" | grep -c export)" -eq 0 ] || { ls -A "$WORK" "$WORK/hf"; echo "export left the wrong files"; exit 1; }

# 9. More of the same kind.
expect_error 0 "sample: --tokens must be >= 1 (got 0)" bin/yuanlm sample --checkpoint "$run" --tokens 0
expect_error 0 "sample: --top-k must be >= 0 (got -1)" bin/yuanlm sample --checkpoint "$run" --top-k -1
expect_error 0 "eval: --micro-batch must be >= 1 (got 0)" bin/yuanlm eval --checkpoint "$run" --micro-batch 0
expect_error 0 "export: --out $WORK/hf/README.md is not a directory" \
  bin/yuanlm export --checkpoint "$run" --out "$WORK/hf/README.md"

# 10. sample --tokens past 100 times the model's context (seq_len 16 here): refused before the shards are read, as
# is a count past int (it used to be "invalid").
expect_error 0 "sample: --tokens 1601 is more than 1600, 100 times the model's context (seq_len 16) of checkpoint" \
  bin/yuanlm sample --checkpoint "$run" --tokens 1601
expect_error 0 "sample: --tokens 1000000000000 is more than 1600" \
  bin/yuanlm sample --checkpoint "$run" --tokens 1000000000000

# 11. eval's refusals under mpirun -np 2 are printed once (rank 0), as train's are, and every rank exits.
expect_error_once 2 "'$WORK/nope' is neither a checkpoint" bin/yuanlm eval --checkpoint "$WORK/nope"
expect_error_once 2 "fewer than one micro-batch reads (--micro-batch 100000000 x 2 readers" \
  bin/yuanlm eval --checkpoint "$run" --micro-batch 100000000
expect_error_once 2 "give --batches <= " bin/yuanlm eval --checkpoint "$run" --batches 100000
expect_error_once 2 "eval: --micro-batch must be >= 1 (got 0)" bin/yuanlm eval --checkpoint "$run" --micro-batch 0
expect_error_once 2 "'$WORK/nope' is neither a checkpoint" bin/yuanlm sample --checkpoint "$WORK/nope"
expect_error_once 2 "sample: --tokens 100000 is more than" bin/yuanlm sample --checkpoint "$run" --tokens 100000
expect_error_once 2 "'$WORK/nope' is neither a checkpoint" bin/yuanlm export --checkpoint "$WORK/nope" \
  --out "$WORK/nope-out"
echo "OK"
