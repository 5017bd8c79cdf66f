# shellcheck shell=bash
# The fast checkpoint tier across two nodes of the test cluster (2 ranks each): every rank's local checkpoint has a
# partner copy in the other node's directory; with node 2's directory gone (its memory lost), a relaunch resumes
# from node 1's own and partner copies and ends with the losses of a run never interrupted; with a rank's own AND
# partner copy gone, it says so and resumes from the filesystem checkpoint; a partner that does not answer stops the
# partner copies for the run, which goes on, and older generations still go. Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64
# In memory, as by default (the nodes share /dev/shm here; %h keeps their directories apart).
SHM=$(mktemp -d /dev/shm/yuanlm-test.XXXXXX)
trap 'st=$?; rm -rf "$SHM"; set +e; (exit $st); cluster_exit' EXIT
args=(--train.steps=10 --train.global_batch=8 --train.micro_batch=2 --ckpt.local_every=2 --ckpt.local_dir="$SHM/%h")
train 4 "$WORK/ref" --train.steps=10 --train.global_batch=8 --train.micro_batch=2 >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; exit 1; }

# killed_run DIR ARGS...: a run SIGKILLed in step 8 (rank 0, and with it the job).
killed_run() {
  local dir=$1 rc
  shift
  set +e
  YUANLM_KILL_AT=7 launch 4 -x YUANLM_KILL_AT bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$dir" \
    "${args[@]}" "$@" >"$WORK/killed.log" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || { cat "$WORK/killed.log"; echo "expected the killed run to fail, got $rc"; exit 1; }
}
expect() {
  grep -qF "$1" "$WORK/log" || { cat "$WORK/log"; echo "no '$1' in the log"; exit 1; }
}

echo "== partner copies on the other node; node 2's memory lost: own + partner copies"
killed_run "$WORK/a"
# Rank r's partner is the same local rank on the next node: 0 <-> 2, 1 <-> 3.
for copy in node1/step_0000006/rank_00000 node1/partner/step_0000006/rank_00002 node1/partner/step_0000006/rank_00003 \
            node2/step_0000006/rank_00003 node2/partner/step_0000006/rank_00000; do
  path=$(local_job "$SHM/${copy%%/*}" "$WORK/a")/${copy#*/}
  [ -f "$path/manifest.json" ] || { find "$SHM"; echo "no $path"; exit 1; }
done
rm -rf "$SHM/node2"
train 4 "$WORK/a" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "resume: from node memory (2 own copies, 2 partner copies; written by 4 ranks), step 6; steps lost: 1"
compare "$WORK/ref" "$WORK/a" 1e-5 1e-5

echo "== rank 2's own and partner copies lost: the filesystem checkpoint"
killed_run "$WORK/b" --ckpt.every=4
rm -rf "$(local_job "$SHM/node2" "$WORK/b")/step_0000006/rank_00002" \
  "$(local_job "$SHM/node1" "$WORK/b")/partner/step_0000006/rank_00002"
train 4 "$WORK/b" "${args[@]}" --ckpt.every=4 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect "local checkpoint step_0000006 of run 1 is incomplete: rank 2's shard is on no live node (its own copy was on node2, its partner copy on node1)"
expect "resume: from the filesystem checkpoint $WORK/b/ckpt/step_0000004, step 4; steps lost: 3"
compare "$WORK/ref" "$WORK/b" 1e-5 1e-5
echo "== a partner that does not answer the exchange: a warning, no more partner copies, the run goes on"
set +e
YUANLM_PARTNER_SILENT=2 launch 4 -x YUANLM_PARTNER_SILENT bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" \
  --run.dir="$WORK/c" "${args[@]}" --dist.timeout_s=5 >"$WORK/log" 2>&1
rc=$?
set -e
[ "$rc" -eq 0 ] || { cat "$WORK/log"; echo "rc $rc"; exit 1; }
expect "warning: [rank 0@node1] local checkpoint step_0000002: a rank it keeps copies of (ranks 2) did not complete the partner exchange within 5 s (dist.timeout_s); no more partner copies in this run, the filesystem checkpoint still holds"
[ "$(grep -c 'did not complete the partner exchange' "$WORK/log")" -eq 1 ] || { cat "$WORK/log"; exit 1; }
compare "$WORK/ref" "$WORK/c" 0 0
echo "== and older generations still go: killed in step 8, each node holds steps 4 and 6 only"
set +e
YUANLM_KILL_AT=7 YUANLM_PARTNER_SILENT=2 launch 4 -x YUANLM_KILL_AT -x YUANLM_PARTNER_SILENT bin/yuanlm train \
  "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/d" "${args[@]}" --dist.timeout_s=5 >"$WORK/log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { cat "$WORK/log"; echo "expected the killed run to fail, got $rc"; exit 1; }
for n in node1 node2; do
  dir=$(local_job "$SHM/$n" "$WORK/d")
  [ "$(cd "$dir" && ls -d step_* | paste -sd' ')" = "step_0000004 step_0000006" ] ||
    { find "$dir" -maxdepth 1; echo "$n: not steps 4 and 6 only"; exit 1; }
done
echo OK
