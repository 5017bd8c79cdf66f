#!/usr/bin/env bash
# The test cluster of tests/cluster/lib.sh by hand (as root):
#
#   eval "$(tests/cluster/cluster.sh up [N])"    N nodes (default 4); prints export YUANLM_CLUSTER=ycl<S>
#   tests/cluster/cluster.sh on K CMD...          CMD on node K (hostname nodeK)
#   tests/cluster/cluster.sh mpirun HOSTS ARGS... mpirun across nodes, e.g. HOSTS=node1:2,node2:2
#   tests/cluster/cluster.sh kill K | partition K | heal K
#   tests/cluster/cluster.sh down                 removes the cluster named by YUANLM_CLUSTER
#
# The cluster belongs to the shell that ran `up` (its parent process): once that shell has gone, the next `up`
# on this machine cleans it away and reuses its slot.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cmd=${1:-}
shift || true
[ "$cmd" = up ] || cluster_use "${YUANLM_CLUSTER:?set YUANLM_CLUSTER (eval the output of cluster.sh up)}" || exit 1
case "$cmd" in
  up)
    why=$(cluster_check) || { echo "cluster.sh: $why" >&2; exit 77; }
    name=$(cluster_start "${1:-4}" "$PPID") || { echo "cluster.sh: $name" >&2; exit 1; }
    echo "cluster $name up: ${1:-4} nodes; run commands with: tests/cluster/cluster.sh on K CMD..." >&2
    echo "export YUANLM_CLUSTER=$name"
    ;;
  on) on_node "$@" ;;
  mpirun) cluster_mpirun "$@" ;;
  kill) node_kill "$1" ;;
  partition) node_partition "$1" ;;
  heal) node_heal "$1" ;;
  down) cluster_down ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
