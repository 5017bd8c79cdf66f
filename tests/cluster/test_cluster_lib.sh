# shellcheck shell=bash
# The test cluster itself (tests/cluster/lib.sh) is what the other tests take it for: ranks land on the nodes
# asked for with their hostnames; shared memory alone joins the ranks of one node but not two (so Open MPI sees
# separate hosts and ranks of different nodes talk TCP); a partition cuts a node off while its processes live and
# healing brings it back; a killed node's processes are gone and it can be neither reached nor launched on; a
# second cluster comes up beside this one under other names; and a test that fails or is killed leaves nothing
# behind (processes, links, namespaces, hosts files, its slot). Exit 77 (skipped) where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
cluster_up 3

echo "== placement: 2 ranks on each of 2 nodes"
got=$(cluster_mpirun "$(cluster_hosts 4 2)" -np 4 hostname | sort | tr '\n' ' ')
[ "$got" = "node1 node1 node2 node2 " ] || { echo "ranks ran on: $got"; exit 1; }
echo "== shared memory alone joins the ranks of one node"
cluster_mpirun node2:2 -np 2 --mca btl self,vader bin/test_yuanlm --gtest_filter='MpiComm*' >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; exit 1; }
echo "== nodes are separate hosts to Open MPI: without TCP, two nodes cannot talk"
if cluster_mpirun "$(cluster_hosts 2 1)" -np 2 --mca btl self,vader bin/test_yuanlm --gtest_filter='MpiComm*' \
  >"$WORK/log" 2>&1; then
  echo "2 ranks on 2 nodes talked over shared memory alone"
  exit 1
fi
grep -q "unable to reach each other" "$WORK/log" || { echo "failed, but not for want of a path:"; cat "$WORK/log"; exit 1; }

echo "== partition node2, then heal it"
on_node 2 sleep 300 &
sleeper=$!
node_reaches 1 2 || { echo "node1 cannot reach node2 before the partition"; exit 1; }
node_partition 2
node_reaches 1 2 && { echo "node1 still reaches node2 across the partition"; exit 1; }
node_reaches 3 1 || { echo "the partition of node2 cut node3 off node1"; exit 1; }
kill -0 $sleeper || { echo "node2's process died in the partition"; exit 1; }
node_heal 2
for _ in $(seq 30); do node_reaches 1 2 && break; sleep 0.1; done
node_reaches 1 2 || { echo "node2 is still cut off after healing"; exit 1; }

echo "== kill node2"
node_kill 2
wait $sleeper 2>/dev/null && { echo "node2's process survived its node"; exit 1; }
node_reaches 1 2 && { echo "node1 still reaches the dead node2"; exit 1; }
if cluster_mpirun node1:1,node2:1 -np 2 hostname >"$WORK/log" 2>&1; then echo "launched on the dead node2"; exit 1; fi
grep -q "node2 of cluster $YUANLM_CLUSTER is down" "$WORK/log" || { cat "$WORK/log"; exit 1; }

echo "== a second cluster beside this one; a failed test and a killed one leave nothing behind"
for how in "exit 3" "kill -TERM \$\$"; do
  other=$(bash -c "source tests/cluster/lib.sh; cluster_up 2 >/dev/null; echo \$YUANLM_CLUSTER
                   on_node 2 sleep 300 & sleep 0.5; $how" 2>"$WORK/inner.log") || true
  [ -n "$other" ] && [ "$other" != "$YUANLM_CLUSTER" ] || { echo "second cluster '$other' (this one $YUANLM_CLUSTER)"; exit 1; }
  left=$( { ip netns list; ip -o link show; ls -d /etc/netns/"$other"* "$CLUSTER_STATE/${other#ycl}"; } 2>/dev/null |
         grep -c "$other\b\|$other[nvb]\|/${other#ycl}$" || true)
  [ "$left" -eq 0 ] || { echo "after '$how', cluster $other left $left things behind"; cat "$WORK/inner.log"; exit 1; }
done
[ -e "/run/netns/$(cluster_netns 1)" ] || { echo "this cluster lost node1"; exit 1; }
echo "the cluster's nodes, faults and tear-down behave"
