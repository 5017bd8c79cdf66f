# A non-finite gradient skips the step with a warning naming it; train.max_bad_steps in a row stop the run
# with a clear error after checkpointing the weights from before the bad steps.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
args=(--train.steps=12 --train.global_batch=4 --train.micro_batch=2 --train.max_bad_steps=3)
YUANLM_NAN_STEPS=4:6 train 2 "$WORK/skip" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep "warning: step 5: non-finite gradient norm, update skipped (1 in a row" "$WORK/log"
grep "warning: step 6: non-finite gradient norm, update skipped (2 in a row" "$WORK/log"
$PY - "$WORK/skip/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert sum(r.get("skipped") == 1 for r in rows) == 2, rows
assert any(r["step"] == 12 and isinstance(r.get("loss"), float) and r["loss"] >= 0 for r in rows), rows
PYEOF

set +e
YUANLM_NAN_STEPS=4:100 train 2 "$WORK/stop" "${args[@]}" >"$WORK/log" 2>&1
rc=$?
set -e
cat "$WORK/log" | tail -4
[ "$rc" -ne 0 ] || { echo "expected a failing exit"; exit 1; }
grep "^error: .*3 consecutive steps with a non-finite loss or gradient norm (steps 5-7); $WORK/stop/ckpt/step_0000007 holds the weights from before them" "$WORK/log"
