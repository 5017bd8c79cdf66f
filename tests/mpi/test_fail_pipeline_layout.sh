# A pipeline layout that cannot run stops every rank before anything is allocated: one error line naming the key
# and the values, a non-zero exit, no rank left waiting (each check is unit-tested in tests/test_layout.cpp).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 2000 64
expect_error() {  # NP MESSAGE ARGS...
  local np=$1 message=$2
  shift 2
  echo "== $np ranks: $*"
  set +e
  timeout 60 mpirun -np "$np" bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" \
    --run.dir="$WORK/run" --train.global_batch=8 --train.micro_batch=2 "$@" >"$WORK/log" 2>&1
  local rc=$?
  set -e
  cat "$WORK/log" | grep '^error:' || true
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failing exit, got $rc"; cat "$WORK/log"; exit 1; }
  grep -qF "$message" "$WORK/log" || { echo "expected: $message"; cat "$WORK/log"; exit 1; }
  [ "$(grep -c '^error:' "$WORK/log")" -eq 1 ] || { echo "expected exactly one error line"; exit 1; }
  [ ! -e "$WORK/run/metrics.jsonl" ] || { echo "a run started"; exit 1; }
}
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
expect_error 2 "parallel.template two: Modules in the pipeline template do not match the modules in the model: h.0 is missing" \
  "--parallel.template=two: wte, wpe | h.1, ln_f" --parallel.pipelines=two --parallel.microbatches=two:4
expect_error 2 "parallel.template two: The first stage must contain wte and wpe" \
  "--parallel.template=two: wpe, h.0 | wte, h.1, ln_f" --parallel.pipelines=two --parallel.microbatches=two:4
expect_error 2 "parallel.template two: The last stage must contain ln_f" \
  "--parallel.template=two: wte, wpe, h.0, ln_f | h.1" --parallel.pipelines=two --parallel.microbatches=two:4
expect_error 3 "Number of ranks in pipeline templates does not match world size: stages (2) x tp_size 1 = 2, world size 3" \
  "$two" --parallel.pipelines=two --parallel.microbatches=two:4
expect_error 2 "All pipelines must have a corresponding number of micro-batches: template two has none" \
  "$two" --parallel.pipelines=two
expect_error 2 "the pipelines take 6 sequences per step" "$two" --parallel.pipelines=two --parallel.microbatches=two:3
expect_error 2 "unknown template 'three'" "$two" --parallel.pipelines=three --parallel.microbatches=two:4
expect_error 2 "optim.zero = 3 needs one stage per pipeline (template 'two' has 2)" \
  "$two" --parallel.pipelines=two --parallel.microbatches=two:4 --optim.zero=3
