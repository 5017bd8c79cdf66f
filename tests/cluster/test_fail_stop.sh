# shellcheck shell=bash
# A stopped rank is named: one rank on node 2 stopped (SIGSTOP) mid-step, under data parallelism with ZeRO 3 over
# 2 nodes and under a 2-stage pipeline with a stage per node (its sends and receives). Within dist.timeout_s + 30 s
# every rank on every node has ended, the exit is non-zero, and the one "error:" line names the operation and group
# that waited and the silent rank and its node (tests/cluster/fail_lib.sh). Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64
silent="world rank 3 on node2 does not answer a liveness ping within [0-9.]+ s: stopped, dead or cut off"

echo "== ZeRO 3, 4 ranks on 2 nodes: rank 3 stopped"
fault_start zero3 4 --optim.zero=3
kill -STOP "$(rank_pids 2 | sort -n | tail -1)"
fault_end zero3 $((TIMEOUT + 30))
one_error zero3 "^error: \[rank 0@node1\] no progress for [0-9]+ s: waiting in [a-z_]+ on group .*dist.timeout_s \
$TIMEOUT; $silent"

echo "== a 2-stage pipeline, one stage per node: the second stage stopped"
CLUSTER_RANKS_PER_NODE=1 fault_start pipeline 2 "--parallel.template=two: wte, wpe, h.0 | h.1, ln_f" \
  --parallel.pipelines=two --parallel.microbatches=two:4
kill -STOP "$(rank_pids 2)"
fault_end pipeline $((TIMEOUT + 30))
one_error pipeline "^error: \[rank 0@node1\] no progress for [0-9]+ s: waiting in [a-z_]+ on group .*dist.timeout_s \
$TIMEOUT; ${silent/rank 3/rank 1}"
