# shellcheck shell=bash
# A test cluster of N nodes on one machine (as root), for the tests in tests/cluster/ and by hand through
# tests/cluster/cluster.sh. Node K is a network namespace ${YUANLM_CLUSTER}nK entered together with a fresh UTS
# namespace whose hostname is nodeK; its one interface eth0 (10.213.S.K/24) is the far end of a veth pair whose
# near end ${YUANLM_CLUSTER}vK sits on the bridge ${YUANLM_CLUSTER}br. The bridge has no address and the nodes no
# default route: the subnet exists only between the nodes. Names resolve through /etc/netns/<netns>/hosts, which
# on_node bind-mounts over /etc/hosts (as `ip netns exec` would). The nodes share the file system. Open MPI
# launches across nodes through tests/cluster/rsh-agent.sh (plm_rsh_agent), which enters the node; ranks talk TCP
# between nodes (btl tcp on eth0) and shared memory within one (vader: Open MPI sees the same hostname).
#
#   cluster_up [N]           N nodes (default 4); sets YUANLM_CLUSTER and CLUSTER_NODES, and a trap that runs
#                            cluster_down when the test exits (also on failure); where namespaces cannot be made it
#                            prints "SKIP: ..." with the reason and exits 77
#   on_node K CMD...         runs CMD on node K (its netns, hostname nodeK, its /etc/hosts)
#   cluster_mpirun HOSTS ARGS...  mpirun started on the first node of HOSTS ("node1:2,node2:2"), across the nodes
#   cluster_hosts NP R       the HOSTS for NP ranks, R per node
#   launch NP CMD...         CMD on NP ranks, CLUSTER_RANKS_PER_NODE (default 2) per node: sourced after
#                            tests/mpi/lib.sh, its train / against_ref run across the nodes
#   node_kill K              node death: every process in node K killed (SIGKILL), its interface and namespace
#                            removed: it can be neither reached nor launched on
#   node_partition K / node_heal K   node K's link down (its processes live on) / up again
#   node_replace K           a fresh node K in place of a killed one
#   node_pids K              the PIDs of the processes in node K
#   cluster_down             ends every process in the nodes and removes everything cluster_up made
#   cluster_slurm_up         SLURM across the nodes: slurmctld on node1, a slurmd on every node, one munged;
#                            exports SLURM_CONF; clients run on a node (slurm_client CMD..., i.e. on node1)
#
# Several clusters may be up at once (another test, a person by hand): each takes a free slot S (0-31) under
# /run/yuanlm-cluster/S, claimed under a lock and owned by a PID (the test's shell; cluster.sh: its caller). A
# slot whose owner is gone is cleaned up and reused. The names and the subnet derive from S: ycl<S>n<K>, ycl<S>v<K>,
# ycl<S>br, 10.213.<100+S>.<K>.

CLUSTER_STATE=${CLUSTER_STATE:-/run/yuanlm-cluster}
CLUSTER_AGENT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/rsh-agent.sh
CLUSTER_MAX_SLOTS=32

cluster_skip() {
  echo "SKIP: $(basename "$0" .sh): the test cluster cannot be made here: $*"
  exit 77
}

# cluster_netns K / cluster_veth K: the names of node K's namespace and of the near end of its link.
cluster_netns() { echo "${YUANLM_CLUSTER:?no test cluster is up (cluster_up)}n$1"; }
cluster_veth() { echo "${YUANLM_CLUSTER:?no test cluster is up (cluster_up)}v$1"; }
cluster_node_addr() { echo "10.213.$((100 + ${YUANLM_CLUSTER#ycl})).$1"; }

# on_node K CMD...: CMD in node K's network namespace, a new UTS namespace named nodeK, and a new mount namespace
# where the node's hosts file covers /etc/hosts -- what `ip netns exec` does, except that `ip netns exec` also
# mounts a fresh /sys, without /sys/fs/cgroup, where slurmd refuses to start.
on_node() {
  local k=$1 ns
  shift
  ns=$(cluster_netns "$k")
  nsenter --net="/run/netns/$ns" unshare --mount --uts \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"' "node$k" "/etc/netns/$ns/hosts" "$@"
}

# node_reaches K J: node K gets an answer from node J within a second (a refused TCP connection is an answer).
node_reaches() {
  local out
  out=$(on_node "$1" timeout 1 bash -c "</dev/tcp/node$2/9" 2>&1)
  [[ $out == *"Connection refused"* ]]
}

node_pids() { ip netns pids "$(cluster_netns "$1")" 2>/dev/null || true; }

# cluster_check: why namespaces cannot be made here (nothing printed and status 0 when they can).
cluster_check() {
  [ "$(id -u)" -eq 0 ] || { echo "not root (network namespaces need root)"; return 1; }
  local t
  for t in ip unshare nsenter flock; do command -v "$t" >/dev/null || { echo "$t not found"; return 1; }; done
  unshare --uts true 2>/dev/null || { echo "unshare --uts fails (no UTS namespaces)"; return 1; }
  return 0
}

# cluster_claim OWNER_PID: takes a free slot (or one whose owner has gone, after cleaning it) and sets
# YUANLM_CLUSTER; the claim itself is done under a short lock so that two callers never take the same slot.
cluster_claim() {
  local owner=$1 s dir pid
  mkdir -p "$CLUSTER_STATE"
  exec 8>>"$CLUSTER_STATE/.lock"
  flock -w 60 8 || { echo "cluster: $CLUSTER_STATE/.lock held for 60 s" >&2; exec 8>&-; return 1; }
  for s in $(seq 0 $((CLUSTER_MAX_SLOTS - 1))); do
    dir=$CLUSTER_STATE/$s
    if [ -d "$dir" ]; then
      pid=$(cat "$dir/owner" 2>/dev/null)
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && continue
      YUANLM_CLUSTER=ycl$s cluster_remove "$(cat "$dir/nodes" 2>/dev/null || echo "$CLUSTER_MAX_SLOTS")"
    elif { ip netns list; ip -o link show; } 2>/dev/null | grep -q "ycl${s}[nvb]"; then
      # Names of a slot without a directory belong to no one (tear-down removes the directory last): left over
      # from a tear-down that was itself killed.
      YUANLM_CLUSTER=ycl$s cluster_remove "$CLUSTER_MAX_SLOTS"
    fi
    mkdir -p "$dir"
    echo "$owner" >"$dir/owner"
    export YUANLM_CLUSTER=ycl$s
    exec 8>&-
    return 0
  done
  exec 8>&-
  echo "cluster: all $CLUSTER_MAX_SLOTS slots under $CLUSTER_STATE are in use" >&2
  return 1
}

# cluster_make N: the bridge and N nodes of the claimed slot; prints why and returns 1 when the kernel refuses.
cluster_make() {
  local n=$1 k br=${YUANLM_CLUSTER}br
  ip link add "$br" type bridge 2>/dev/null || { echo "cannot create a bridge (ip link add $br type bridge)"; return 1; }
  ip link set "$br" up || return 1
  for k in $(seq "$n"); do node_make "$k" "$n" || return 1; done
  # The nodes see one another (the bridge forwards once its ports have left the listening state).
  node_joined "$n"
}

# node_make K N: node K of a cluster of N on the bridge (its namespace, link, address and hosts file); prints why
# and returns 1 when the kernel refuses.
node_make() {
  local k=$1 n=$2 ns veth hosts j
  ns=$(cluster_netns "$k") veth=$(cluster_veth "$k")
  hosts=$(printf '127.0.0.1 localhost\n'; for j in $(seq "$n"); do echo "$(cluster_node_addr "$j") node$j"; done)
  ip netns add "$ns" 2>/dev/null || { echo "cannot create a network namespace (ip netns add $ns)"; return 1; }
  ip link add "$veth" type veth peer name eth0 netns "$ns" 2>/dev/null ||
    { echo "cannot create a veth pair into $ns"; return 1; }
  ip link set "$veth" master "${YUANLM_CLUSTER}br" && ip link set "$veth" up || return 1
  ip -n "$ns" addr add "$(cluster_node_addr "$k")/24" dev eth0 && ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up || return 1
  mkdir -p "/etc/netns/$ns"
  echo "$hosts" >"/etc/netns/$ns/hosts"
}

# node_joined K: node K reaches node 1 within 2 s (else says so, status 1).
node_joined() {
  for _ in $(seq 20); do
    node_reaches "$1" 1 && return 0
    sleep 0.1
  done
  echo "node$1 cannot reach node1 over the bridge"
  return 1
}

# node_replace K: a fresh node K in place of a killed one (a repaired or spare machine), joined to the cluster.
node_replace() {
  local why
  why=$(node_make "$1" "$CLUSTER_NODES" && node_joined "$1") || { echo "cluster: node$1: $why" >&2; return 1; }
}

cluster_up() {
  local why
  unset YUANLM_CLUSTER  # one inherited from a caller's cluster is not ours to tear down
  why=$(cluster_check) || cluster_skip "$why"
  # The trap removes whatever is made, on every way out (set before anything is made).
  trap 'cluster_exit' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  why=$(cluster_start "${1:-4}" $$) || cluster_skip "$why"
  cluster_use "$why"
  echo "cluster $YUANLM_CLUSTER: $CLUSTER_NODES nodes node1-node$CLUSTER_NODES on $(cluster_node_addr 0)/24"
}

# cluster_start N OWNER_PID: claims a slot and makes N nodes, without a trap (tests/cluster/cluster.sh: the
# cluster outlives the call); prints YUANLM_CLUSTER on success, else why not (status 1, nothing left behind).
cluster_start() {
  local n=$1 why
  cluster_claim "$2" || return 1
  echo "$n" >"$CLUSTER_STATE/${YUANLM_CLUSTER#ycl}/nodes"
  if ! why=$(cluster_make "$n"); then
    cluster_down
    echo "$why"
    return 1
  fi
  echo "$YUANLM_CLUSTER"
}

# cluster_use NAME: works on the cluster NAME (ycl<S>) from here on.
cluster_use() {
  export YUANLM_CLUSTER=$1
  CLUSTER_NODES=$(cat "$CLUSTER_STATE/${1#ycl}/nodes" 2>/dev/null) || { echo "no test cluster $1 is up" >&2; return 1; }
  export CLUSTER_NODES
}

# The EXIT trap: the test's status survives the tear-down; $WORK (tests/mpi/lib.sh) goes too.
cluster_exit() {
  local rc=$?
  set +e  # tear everything down, whatever fails on the way (a node already gone)
  cluster_down
  [ -n "${WORK:-}" ] && rm -rf "$WORK"
  exit "$rc"
}

cluster_down() {
  [ -n "${YUANLM_CLUSTER:-}" ] || return 0
  local dir=$CLUSTER_STATE/${YUANLM_CLUSTER#ycl}
  cluster_remove "$(cat "$dir/nodes" 2>/dev/null || echo "$CLUSTER_MAX_SLOTS")"
  rm -rf "$dir"
  unset YUANLM_CLUSTER CLUSTER_NODES
}

# cluster_remove N: kills the processes of nodes 1..N of the current slot and deletes their links, namespaces,
# hosts files and the bridge. Each part may be missing (a half-made cluster, a killed node).
cluster_remove() {
  local n=$1 k
  for k in $(seq "$n"); do node_kill "$k"; done
  ip link del "${YUANLM_CLUSTER}br" 2>/dev/null
  return 0
}

node_kill() {
  local k=$1 ns veth pids
  ns=$(cluster_netns "$k") veth=$(cluster_veth "$k")
  # Processes forked while we kill (a launcher's children) are caught by the next round.
  for _ in 1 2 3 4 5; do
    pids=$(node_pids "$k")
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.1
  done
  ip link del "$veth" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  rm -rf "/etc/netns/$ns"
  # The veth goes asynchronously: a node made again at once with the same name would fail.
  for _ in $(seq 50); do ip link show "$veth" >/dev/null 2>&1 || break; sleep 0.1; done
  return 0
}

node_partition() { ip link set "$(cluster_veth "$1")" down; }
node_heal() { ip link set "$(cluster_veth "$1")" up; }

# cluster_mpirun HOSTS [mpirun args...]: mpirun on the first node named in HOSTS, --host HOSTS, launching the
# other nodes' daemons through the rsh agent; TCP on eth0 between nodes, shared memory inside one. The MCA
# settings go in the environment, so that an --mca on the command line overrides them.
cluster_mpirun() {
  local hosts=$1 first root=()
  shift
  first=${hosts%%[:,]*}
  [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  on_node "${first#node}" env OMPI_MCA_plm_rsh_agent="$CLUSTER_AGENT" OMPI_MCA_btl=tcp,self,vader \
    OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 mpirun "${root[@]}" --host "$hosts" "$@"
}

# cluster_hosts NP RANKS_PER_NODE: "node1:R,node2:R,..." for cluster_mpirun: NP ranks, R on each node in turn
# (the last may get fewer).
cluster_hosts() {
  local left=$1 rpn=$2 k=1 out=
  for (( ; left > 0; left -= rpn, k++)); do out+=${out:+,}node$k:$((left < rpn ? left : rpn)); done
  (( k - 1 <= CLUSTER_NODES )) ||
    { echo "cluster: $1 ranks at $rpn per node need $((k - 1)) nodes; cluster $YUANLM_CLUSTER has $CLUSTER_NODES" >&2; return 1; }
  echo "$out"
}

# launch NP CMD... (the hook of tests/mpi/lib.sh's train): NP ranks, CLUSTER_RANKS_PER_NODE (default 2) per node.
launch() {
  local np=$1 hosts
  shift
  hosts=$(cluster_hosts "$np" "${CLUSTER_RANKS_PER_NODE:-2}") || return 1
  cluster_mpirun "$hosts" -np "$np" "$@"
}

# cluster_slurm_up: the private test SLURM of tests/slurm/daemons.sh with a node per cluster node, all of its
# daemons inside the nodes (so that cluster_down ends them with everything else), its directory in the slot's.
# slurm_client CMD... (also used by tests/slurm/lib.sh's wait_jobs and job_field) then runs a client on node1: the
# controller is reachable only from inside the subnet. Where SLURM cannot run: SKIP and exit 77.
cluster_slurm_up() {
  local d=$CLUSTER_STATE/${YUANLM_CLUSTER#ycl}/slurm why hw k lines=()
  source "$(dirname "$CLUSTER_AGENT")/../slurm/daemons.sh"
  why=$(slurm_need) || cluster_skip "SLURM: $why"
  hw=$(slurm_hw) || cluster_skip "SLURM: $hw"
  for k in $(seq "$CLUSTER_NODES"); do lines+=("NodeName=node$k $hw"); done
  slurm_conf "$d" node1 "${lines[@]}"
  export SLURM_CONF=$d/etc/slurm.conf
  why=$(munge_start "$d" on_node && slurm_start "$d" "$CLUSTER_NODES" on_node) ||
    { slurm_daemon_logs "$d"; cluster_skip "SLURM: $why"; }
  slurm_client() { on_node 1 "$@"; }
  echo "cluster $YUANLM_CLUSTER: SLURM up on node1-node$CLUSTER_NODES, SLURM_CONF=$SLURM_CONF"
}
