# The fast checkpoint tier's checkpoints belong to one run of one run directory:
# - a launch that starts over (ckpt.resume=DIR from an older checkpoint) is numbered above every earlier run, and a
#   later auto-resume continues it, not the abandoned run's newer node-memory step; so does one that could not see
#   the abandoned run's node memory (run.dir/runs.jsonl numbers it); ckpt.resume=none is refused while node memory
#   holds the run.dir's checkpoints, as it is for run.dir/ckpt's;
# - two jobs given one ckpt.local_dir keep apart: the one that finishes leaves the other's checkpoints, which it then
#   resumes from;
# - a checkpoint's step always has its record in metrics.jsonl: killed right after the seal, the relaunch says it
#   lost no step, and the log ends with every step exactly once.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
SHM=$(mktemp -d /dev/shm/yuanlm-test.XXXXXX)
trap 'rm -rf "$WORK" "$SHM"' EXIT
node="$SHM/$(hostname)"
args=(--train.steps=12 --train.global_batch=12 --train.micro_batch=2 --ckpt.local_every=2 --ckpt.local_dir="$SHM/%h")

# killed NP DIR HOOK=STEP [overrides...]: a run SIGKILLed by the test hook HOOK (its mpirun with it).
killed() {
  local np=$1 dir=$2 hook=$3 rc
  shift 3
  set +e
  env "$hook" timeout 60 mpirun -x "${hook%%=*}" -np "$np" bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$dir" "${args[@]}" "$@" >"$WORK/killed.log" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$WORK/killed.log"; echo "expected the killed run to fail, got $rc"; exit 1; }
}
expect() {
  grep -qF -- "$1" "$WORK/log" || { cat "$WORK/log"; echo "no '$1' in the log"; exit 1; }
}
# steps_logged DIR: the steps of DIR/metrics.jsonl's step records, in order.
steps_logged() {
  $PY -c 'import json, sys
print(" ".join(str(r["step"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" not in r))' "$1/metrics.jsonl"
}

echo "== started over from an older checkpoint: the new run, not the abandoned run's newer step"
R=$WORK/a
killed 2 "$R" YUANLM_KILL_AT=7 --ckpt.every=3
local=$(local_job "$node" "$R")
[ -d "$local/step_0000006" ] || { ls -R "$SHM"; exit 1; }
# Run 2 starts from step 3 with another learning rate and is killed in step 6, after its node-memory step 4.
killed 2 "$R" YUANLM_KILL_AT=5 --ckpt.every=3 --ckpt.resume="$R/ckpt/step_0000003" --optim.lr=1e-3
train 2 "$R" "${args[@]}" --optim.lr=1e-3 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks), step 4; steps lost: 1 (the previous run logged step 5)"
[ "$(steps_logged "$R")" = "1 2 3 4 5 6 7 8 9 10 11 12" ] || { cat "$R/metrics.jsonl"; exit 1; }
[ "$($PY -c 'import json, sys; print(" ".join(str(json.loads(l)["run"]) for l in open(sys.argv[1])))' "$R/runs.jsonl")" = "1 2 3" ] ||
  { cat "$R/runs.jsonl"; exit 1; }
grep -q '"run":3,.*"step":4,"from":"node memory' "$R/runs.jsonl" || { cat "$R/runs.jsonl"; exit 1; }

echo "== ckpt.resume=none refused while node memory holds the run.dir's checkpoints; out of sight, the abandoned run"
echo "   is still numbered below the new one"
R=$WORK/b
killed 2 "$R" YUANLM_KILL_AT=7 --ckpt.every=0
local=$(local_job "$node" "$R")
cp "$R/metrics.jsonl" "$WORK/metrics.before"
set +e
train 2 "$R" "${args[@]}" --ckpt.every=0 --ckpt.resume=none >"$WORK/log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { cat "$WORK/log"; echo "ckpt.resume=none was not refused"; exit 1; }
expect "run.dir $R: node memory holds its checkpoints (the newest is step_0000006 of run 1, in $local/step_0000006 on $(hostname)) and ckpt.resume=none would start over in it"
cmp "$R/metrics.jsonl" "$WORK/metrics.before" || { echo "the refused run changed metrics.jsonl"; exit 1; }
mv "$local" "$WORK/away"  # on a node the next job does not have
killed 2 "$R" YUANLM_KILL_AT=5 --ckpt.every=0 --ckpt.resume=none --optim.lr=1e-3
cp -r "$WORK/away/step_0000006" "$local/"  # the node is back, with the abandoned run's step 6
train 2 "$R" "${args[@]}" --ckpt.every=0 --optim.lr=1e-3 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks), step 4; steps lost: 1"

echo "== two jobs in one ckpt.local_dir: the one that finishes leaves the other's checkpoints"
killed 2 "$WORK/x" YUANLM_KILL_AT=7 --ckpt.every=0
train 2 "$WORK/y" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
[ ! -e "$(local_job "$node" "$WORK/y")" ] || { ls -R "$SHM"; echo "the finished job left its checkpoints"; exit 1; }
[ -d "$(local_job "$node" "$WORK/x")/step_0000006" ] || { ls -R "$SHM"; echo "the finished job removed the other's"; exit 1; }
train 2 "$WORK/x" "${args[@]}" --ckpt.every=0 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks), step 6; steps lost: 1"
compare "$WORK/y" "$WORK/x" 1e-5 1e-5

echo "== killed right after a checkpoint's seal: its step is in metrics.jsonl"
# One rank: its own copy sealed is the whole generation.
killed 1 "$WORK/s" YUANLM_KILL_AFTER_SEAL=8 --ckpt.every=0
[ "$(steps_logged "$WORK/s")" = "1 2 3 4 5 6 7 8" ] || { cat "$WORK/s/metrics.jsonl"; exit 1; }
train 1 "$WORK/s" "${args[@]}" --ckpt.every=0 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "resume: from node memory (1 own copy, 0 partner copies; written by 1 rank), step 8; steps lost: 0 (the previous run logged step 8)"
! grep -q "have no record" "$WORK/log" || { cat "$WORK/log"; exit 1; }
[ "$(steps_logged "$WORK/s")" = "1 2 3 4 5 6 7 8 9 10 11 12" ] || { cat "$WORK/s/metrics.jsonl"; exit 1; }
echo OK
