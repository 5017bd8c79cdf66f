# shellcheck shell=bash
# A network partition: node 2's link set down mid-step (its ranks live on). For good (tp 2 inside each node, data
# parallel across them): every rank on both sides has ended within dist.timeout_s + 30 s, mpirun and node 2's
# orted included (they would wait for each other for ever), the exit is non-zero, and the one "error:" line names
# the ranks of node 2 as silent and the operation and group that waited. For 3 s, under a deadline of 10 s: the job
# rides it out, goes on, and the step line shows the stall. Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64

echo "== node 2 cut off for good: tp 2 in each node, data parallel across"
fault_start cut 4 --parallel.tp_size=2
node_partition 2
fault_end cut $((TIMEOUT + 30))
one_error cut "^error: \[rank 0@node1\] no progress for [0-9]+ s: waiting in [a-z_]+ on group .*dist.timeout_s \
$TIMEOUT; world ranks 2-3 on node2 do not answer a liveness ping within [0-9.]+ s: stopped, dead or cut off"

echo "== node 2 cut off for 3 s under dist.timeout_s 10: ridden out"
node_heal 2
TIMEOUT=10 fault_start healed 4 --optim.zero=1
node_partition 2
sleep 3
node_heal 2
before=$(grep -c '"loss"' "$WORK/healed/metrics.jsonl")
for _ in $(seq 100); do [ "$(grep -c '"loss"' "$WORK/healed/metrics.jsonl")" -ge $((before + 5)) ] && break; sleep 0.1; done
[ "$(grep -c '"loss"' "$WORK/healed/metrics.jsonl")" -ge $((before + 5)) ] ||
  { cat "$WORK/healed.log"; echo "healed: the training did not go on"; exit 1; }
grep -E "^step .* \| stalled [0-9.]+ s in [a-z_]+ on group [a-z]+" "$WORK/healed.log" ||
  { cat "$WORK/healed.log"; echo "healed: no step line shows the stall"; exit 1; }
! grep "^error:" "$WORK/healed.log" || { echo "healed: an error line"; exit 1; }
# Ended as a batch system would before its time limit: every rank checkpoints and the job exits 75.
for k in 1 2; do for p in $(rank_pids $k); do kill -USR1 "$p"; done; done
set +e
wait "$FAULT_JOB"
rc=$?
set -e
[ "$rc" -eq 75 ] || { tail "$WORK/healed.log"; echo "healed: exit $rc after SIGUSR1, not 75"; exit 1; }
