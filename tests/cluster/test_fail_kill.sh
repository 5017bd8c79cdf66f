# shellcheck shell=bash
# A lost node: every process of node 2 killed and its interface removed, mid-step (ZeRO 2 over 2 nodes). Open MPI
# sees its daemon go and ends the job itself, faster than any deadline: every rank on every node has ended within
# dist.timeout_s + 30 s, the exit is non-zero and no process of the job is left. Open MPI ends node 1's ranks with
# SIGTERM (SIGKILL a second later); they ping every rank, and the lowest that answers writes the job's one line,
# naming node 2's ranks and node 2 as lost. Open MPI's own text names node2 too, whichever way it learns of the loss:
# from the daemon's TCP connection closing (its message names node2) or, first, from the daemon's launch agent
# exiting (then it says only that it "was unable to reliably start one or more daemons", and the agent's own line
# names node2, as ssh's "Connection to node2 closed by remote host." would): a race, about 1 run in 8 the second way
# on the 2-core VM. (A node that vanishes without closing its connections, as a power failure does, looks like a
# partition: tests/cluster/test_fail_partition.sh.) Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64

echo "== node 2 killed: ZeRO 2, 2 ranks on each of 2 nodes"
fault_start killed 4 --optim.zero=2
node_kill 2
fault_end killed $((TIMEOUT + 30))
grep -Eq "(Remote daemon: .* on node node2|Peer host: +node2|on node node2 exited on signal|^rsh-agent.sh: node2: \
the command there was killed)" "$WORK/killed.log" ||
  { cat "$WORK/killed.log"; echo "killed: nothing names node2"; exit 1; }
one_error killed "^error: \[rank 0@node1\] the launcher is ending the job \(SIGTERM\): world ranks 2-3 on node2 do not \
answer a liveness ping within 0.5 s: node2 is lost or cut off; ending$"
