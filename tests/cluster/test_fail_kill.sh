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
# partition: tests/cluster/test_fail_partition.sh.) Then a rank that fails with its own error, alone on its node:
# mpirun ends the other with SIGTERM too, and that rank's ping finds a whole node silent, but the failing rank told
# every rank before its MPI_Abort, so its line stays the only one. Exit 77 where namespaces cannot be made.
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

echo "== rank 1 fails on its own, one rank per node: its line alone"
node_replace 2
OMPI_MCA_mca_base_env_list=YUANLM_FAIL_AT YUANLM_FAIL_AT=1:8 CLUSTER_RANKS_PER_NODE=1 fault_start lone 2
fault_end lone $((TIMEOUT + 30))
one_error lone "^error: \[rank 1@node2\] injected failure at step 8 \(YUANLM_FAIL_AT\)$"
