# A run directory has one owner (issue 21, data-loss case 3): two trainings started 1.5 s apart on one run.dir with
# different learning rates. The second is refused with one line naming the directory and the holder, on every rank
# and at once; the first finishes alone, so the checkpoints and metrics.jsonl are only its own. A training killed
# with kill -9 leaves no stale lock: the next one on its directory starts (and resumes).
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
run="$WORK/run"
args=(--train.steps=1000 --train.global_batch=8 --train.micro_batch=4 --ckpt.every=250)

train 2 "$run" "${args[@]}" --optim.lr=3e-3 >"$WORK/first.log" 2>&1 &
first=$!
# Once the first holds the lock (its holder line written), its ranks are stopped while the second tries the
# directory: on a fast machine 1000 tiny steps end within the second's start-up (2026-11-28: "nothing to do: the
# checkpoint is at step 1000"), and a stopped process still holds its lock. They go on once the second has ended.
for _ in $(seq 300); do [ -s "$run/.lock" ] && break; sleep 0.05; done
[ -s "$run/.lock" ] || { cat "$WORK/first.log"; echo "the first run wrote no lock in 15 s"; exit 1; }
ranks=$(procs bin/yuanlm)
[ -n "$ranks" ] || { cat "$WORK/first.log"; echo "the first run's ranks are gone before the second started"; exit 1; }
kill -STOP $ranks
start=$(date +%s)
set +e
timeout 60 bash -c "$(declare -p TINY WORK); $(declare -f launch train); train 2 '$run' ${args[*]} --optim.lr=1e-2" \
  >"$WORK/second.log" 2>&1
rc=$?
kill -CONT $ranks
wait "$first"
rc_first=$?
set -e
echo "second: exit $rc after $(($(date +%s) - start)) s; first: exit $rc_first"
grep "^error:" "$WORK/second.log" || true
[ "$rc_first" -eq 0 ] || { cat "$WORK/first.log"; echo "the first run failed"; exit 1; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -20 "$WORK/second.log"; echo "the second run was not refused"; exit 1; }
[ "$(grep -c '^error:' "$WORK/second.log")" -eq 1 ] || { echo "not one error line"; exit 1; }
grep -q "^error: \[rank 0@[^]]*\] run.dir $run is in use by another training (host [^,]*, pid [0-9]*, started " \
  "$WORK/second.log" || { echo "the refusal does not name the directory and its holder"; exit 1; }
grep -q "done: 1000 steps" "$WORK/first.log"
# Only the first run's record: every step once, with its learning rate (3e-3 peak) and config.
$PY - "$run" <<'PYEOF'
import json, sys, glob
d = sys.argv[1]
steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
assert [s["step"] for s in steps] == list(range(1, 1001)), [s["step"] for s in steps]
assert max(s["lr"] for s in steps) <= 3e-3 * (1 + 1e-9), max(s["lr"] for s in steps)
for f in [f"{d}/config.ini"] + glob.glob(f"{d}/ckpt/step_*/config.ini"):
    assert "lr = 0.003\n" in open(f).read(), f
print("metrics.jsonl, config.ini and", len(glob.glob(f"{d}/ckpt/step_*")), "checkpoints are the first run's")
PYEOF

echo "== kill -9 leaves no stale lock"
set +e
YUANLM_KILL_AT=12 train 2 "$WORK/killed" "${args[@]}" --ckpt.every=10 >"$WORK/killed.log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "the killed run exited 0"; exit 1; }
train 2 "$WORK/killed" "${args[@]}" --ckpt.every=10 --train.steps=13 >"$WORK/again.log" 2>&1 ||
  { cat "$WORK/again.log"; exit 1; }
grep "resumed from $WORK/killed/ckpt/step_0000010" "$WORK/again.log"
