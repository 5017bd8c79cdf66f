# shellcheck shell=bash
# A lost node: every process of node 2 killed and its interface removed, mid-step (ZeRO 2 over 2 nodes). Open MPI
# sees its daemon go (the TCP connection closes as the processes die) and ends the job itself, faster than any
# deadline: every rank on every node has ended within dist.timeout_s + 30 s, the exit is non-zero, no process of
# the job is left, and mpirun's own message names the lost node. (A node that vanishes without closing its
# connections, as a power failure does, looks like a partition: tests/cluster/test_fail_partition.sh.)
# Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64

echo "== node 2 killed: ZeRO 2, 2 ranks on each of 2 nodes"
fault_start killed 4 --optim.zero=2
node_kill 2
fault_end killed $((TIMEOUT + 30))
grep -Eq "(Remote daemon: .* on node node2|Peer host: +node2|on node node2 exited on signal)" "$WORK/killed.log" ||
  { cat "$WORK/killed.log"; echo "killed: nothing names node2"; exit 1; }
