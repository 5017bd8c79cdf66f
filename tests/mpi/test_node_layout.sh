# The node-aware layout. `yuanlm plan --nodes N --ranks-per-node G` prints each node's ranks and groups and which
# groups cross a node boundary (--json too, its existing fields unchanged), and refuses values that do not make the
# job's ranks. Then jobs over two nodes as Open MPI sees them: mpirun's rsh agent is a script that starts each
# "node"'s daemon on this machine (with a temporary directory of its own, orte_tmpdir_base), so the ranks form two shared-memory domains
# (MPI_COMM_TYPE_SHARED); they talk TCP over loopback, within a node too (two daemons' shared-memory transports on
# one host clash). The start-up print shows both nodes, a tensor group placed across them is warned of by name, and
# the memory check sums the ranks of each node only. The namespaced test cluster (tests/cluster/) runs real nodes.
source "$(dirname "$0")/lib.sh"

fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
# expect FILE PATTERN...: every pattern (grep -E) has a line in FILE.
expect() {
  local file=$1
  shift
  for p in "$@"; do grep -qE -- "$p" "$file" || fail "no line matching '$p' in $file:" "$file"; done
}

data='data\[modules 0-4\]'  # the data groups of the tiny model without pipelines
plan=(bin/yuanlm plan "${TINY[@]}" --data.train=x --train.global_batch=6 --train.micro_batch=1)
# 3 replicas of tp 2 on 2 nodes of 3: tensor[1.0] (ranks 2-3) straddles them.
"${plan[@]}" --world 6 --parallel.tp_size=2 --nodes 2 >"$WORK/plan.out" 2>"$WORK/plan.err"
expect "$WORK/plan.out" '^nodes: 2 of 3 ranks$' \
  "^  node 0: ranks 0-2; tensor\[0\.0\] ranks 0-1; tensor\[1\.0\] ranks 2-3 across nodes 0-1; $data ranks 0,2\.\.4" \
  '^  node 1: ranks 3-5; tensor\[1\.0\] ranks 2-3 across nodes 0-1; tensor\[2\.0\] ranks 4-5;' \
  '^tensor groups: 3, 1 crossing a node boundary: tensor\[1\.0\] ranks 2-3 on nodes 0-1$' \
  '^pipeline groups: none of more than one rank$' '^data groups: 2, 2 crossing a node boundary'
[ "$(grep -c . "$WORK/plan.err")" = 1 ] || fail "expected one warning:" "$WORK/plan.err"
expect "$WORK/plan.err" '^warning: tensor group tensor\[1\.0\] \(ranks 2-3\) crosses a node boundary: its ranks' \
  'are on node 0 and node 1, so its all-reduces in every layer'

# Two 2-stage pipelines of tp 2 on 4 nodes of 2 (the world from the pipelines): tensor groups inside nodes, each
# pipeline across 2 nodes.
pipes=(--parallel.tp_size=2 "--parallel.template=two: auto:2" --parallel.pipelines=two,two
       --parallel.microbatches=two:3)
"${plan[@]}" "${pipes[@]}" --ranks-per-node 2 >"$WORK/pipes.out" 2>"$WORK/pipes.err"
expect "$WORK/pipes.out" '^nodes: 4 of 2 ranks$' '^tensor groups: 4, all inside a node$' \
  '^pipeline groups: 4, 4 crossing a node boundary: pipeline\[0\] ranks 0,2 on nodes 0-1; pipeline\[0\] ranks 1,3' \
  'on nodes 0-1; pipeline\[1\] ranks 4,6 on nodes 2-3; pipeline\[1\] ranks 5,7 on nodes 2-3$' \
  '^  node 3: ranks 6-7; tensor\[1\.1\] ranks 6-7; pipeline\[1\] ranks 4,6 across nodes 2-3'
[ ! -s "$WORK/pipes.err" ] || fail "warnings with every tensor group inside a node:" "$WORK/pipes.err"

# --json: the rows without --nodes, each with the node of its tensor ranks and whether its groups cross.
"${plan[@]}" "${pipes[@]}" --json >"$WORK/plain.json"
"${plan[@]}" "${pipes[@]}" --json --nodes 4 --ranks-per-node 2 >"$WORK/nodes.json" 2>/dev/null
$PY - "$WORK/plain.json" "$WORK/nodes.json" <<'EOF'
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
rows = [json.loads(l) for l in open(sys.argv[2])]
assert len(rows) == len(plain) == 4, (plain, rows)
for p, r in zip(plain, rows):
    assert {k: r[k] for k in p} == p and list(r)[:len(p)] == list(p), (p, r)
    first = r["first_rank"]
    assert r["nodes"] == [first // 2, first // 2], r
    assert r["crosses"] == {"tensor": False, "pipeline": True, "data": True}, r
EOF

# Values that do not make the job's ranks: one line each, exit 1.
refused() {
  local pattern=$1 rc=0
  shift
  "${plan[@]}" "$@" >"$WORK/refused.log" 2>&1 || rc=$?
  if [ "$rc" != 1 ] || [ "$(grep -c . "$WORK/refused.log")" != 1 ] || ! grep -qE -- "^error: .*plan: $pattern" \
       "$WORK/refused.log"; then
    fail "plan $*: rc $rc, expected one error line matching '$pattern'" "$WORK/refused.log"
  fi
}
refused '--nodes 2 x --ranks-per-node 2 = 4 ranks, but the job has 6 \(--world\)' --world 6 --nodes 2 --ranks-per-node 2
refused '--nodes 2 x --ranks-per-node 2 = 4 ranks, but the job has 8 \(the deck.s pipelines\)' "${pipes[@]}" \
  --nodes 2 --ranks-per-node 2
refused 'the job.s 6 ranks \(--world\) do not divide over --nodes 4; give --nodes and --ranks-per-node whose product' \
  --world 6 --nodes 4
refused 'the job.s 6 ranks \(--world\) do not divide over --ranks-per-node 4' --world 6 --ranks-per-node 4
refused '--nodes 0 must be at least 1' --world 6 --nodes 0
refused 'a data-parallel deck \(no parallel.pipelines\) on nodes needs --world, or both --nodes and --ranks-per-node' \
  --nodes 2

# Two nodes on this machine, as Open MPI sees them (see the top): a fake rsh agent runs each node's daemon here.
cat >"$WORK/rsh" <<EOF
#!/bin/sh
# Open MPI's rsh agent for nodes that are this machine: run the command here, with the node's own Open MPI temporary directory.
mkdir -p "$WORK/orte-tmp/\$1"
export OMPI_MCA_orte_tmpdir_base="$WORK/orte-tmp/\$1"
shift
exec sh -c "\$*"
EOF
chmod +x "$WORK/rsh"
# Ranks that wait yield the cores (TCP progress on an oversubscribed machine takes seconds a step otherwise).
nodes=(--mca plm_rsh_agent "$WORK/rsh" --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
       --mca mpi_yield_when_idle 1 --host nodea:2,nodeb:2)
if ! timeout 60 mpirun "${nodes[@]}" -np 4 bin/yuanlm plan "${TINY[@]}" --data.train=x >"$WORK/probe.log" 2>&1; then
  echo "SKIP: mpirun cannot start two nodes on this machine through an rsh agent and TCP over loopback:"
  cat "$WORK/probe.log"
  exit 77
fi
make_corpus "$WORK/corpus" 1 4000 64
# two_nodes NAME ARGS...: 4 ranks of tp 2 over the two nodes, one step; mpirun's own options first in ARGS.
two_nodes() {
  local name=$1
  shift
  timeout 120 mpirun "${nodes[@]}" "$@" bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" \
    --run.dir="$WORK/$name" --train.steps=1 --train.global_batch=4 --train.micro_batch=2 --parallel.tp_size=2 \
    >"$WORK/$name.log" 2>&1 || fail "$name: the job failed" "$WORK/$name.log"
  expect "$WORK/$name.log" '^done'
}
# Ranks in blocks (mpirun's default): each tensor group in a node, the data groups across, no warning.
two_nodes block -np 4
expect "$WORK/block.log" '^parallel: 4 ranks as 2 replicas of tp 2 x 2 micro-batch x 1 accumulation = 4 sequences' \
  '^nodes: 2 of 2 ranks$' \
  "^  node 0 \(.+\): ranks 0-1; tensor\[0\.0\] ranks 0-1; $data ranks 0,2 across nodes 0-1; $data ranks 1,3 across" \
  '^  node 1 \(.+\): ranks 2-3; tensor\[1\.0\] ranks 2-3; data'
! grep -q '^warning: tensor group' "$WORK/block.log" || fail "block: a tensor group warned of" "$WORK/block.log"
# Round robin over the nodes: every tensor group straddles them, and each is named.
two_nodes cyclic -np 4 --map-by node
expect "$WORK/cyclic.log" '^  node 0 \(.+\): ranks 0,2; tensor\[0\.0\] ranks 0-1 across nodes 0-1' \
  '^warning: tensor group tensor\[0\.0\] \(ranks 0-1\) crosses a node boundary: its ranks are on node 0 \(.+\) and' \
  '^warning: tensor group tensor\[1\.0\] \(ranks 2-3\) crosses'
# The memory check adds up the ranks of each node: 4 tiny ranks need over 1 GiB on one node (their margins), and
# 2 per node fit in 600 MiB; 3 on one node do not fit in 700 MiB, and the error (rank 0 speaks for all) names
# that node.
YUANLM_NODE_MEMORY=600M two_nodes memory -np 4 -x YUANLM_NODE_MEMORY
rc=0
YUANLM_NODE_MEMORY=700M timeout 120 mpirun "${nodes[@]/nodea:2,nodeb:2/nodea:1,nodeb:3}" -np 4 -x YUANLM_NODE_MEMORY \
  bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/uneven" --train.global_batch=4 \
  --train.micro_batch=1 >"$WORK/uneven.log" 2>&1 ||
  rc=$?
[ "$rc" = 1 ] && [ "$(grep -c '^error: ' "$WORK/uneven.log")" = 1 ] || fail "uneven: rc $rc" "$WORK/uneven.log"
expect "$WORK/uneven.log" '^error: \[rank 0@.*\] memory: the 3 ranks on node 1 \(.+\) need 0\.7[0-9] GiB .*0\.68 GiB'
echo "node layout: plan over nodes, two nodes' start-up print, warnings and memory"
