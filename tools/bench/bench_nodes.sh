#!/usr/bin/env bash
# Two nodes against one (the test cluster of tests/cluster/lib.sh: TCP over a veth bridge between nodes, shared
# memory inside one): the same data-parallel job, 4 ranks, 2 on each of 2 nodes against 4 on one node, as a
# tokens/s ratio, with each run's share of step time in communication (metrics comm_s / step_s, mean of steps
# 3-N), the bytes rank 0 moved per step, and, as the limit, the link's latency and bandwidth measured by an MPI
# ping-pong (bin/bench_pingpong) over the same path: shared memory inside node1, TCP from node1 to node2.
# Exit 77 (with a SKIP line) where the test cluster cannot be made.
source "$(dirname "$0")/../../tests/mpi/lib.sh"
source tests/cluster/lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 1 40000 4096
L=2 C=128 T=64 V=4096 B=2 G=16 steps=10
model=(--model.n_layer=$L --model.n_head=4 --model.n_embd=$C --model.seq_len=$T --model.vocab_size=$V
       --train.steps=$steps --train.log_every=1 --train.global_batch=$G --train.micro_batch=$B)
echo "model: $L blocks x $C wide, seq $T, vocab $V; micro-batch $B, global batch $G, 4 ranks data parallel" \
  "(ZeRO 1), $steps steps; $(nproc --all) cores shared by every node"
echo "== the link (ping-pong through the same MPI)"
cluster_mpirun node1:2 -np 2 bin/bench_pingpong | tee "$WORK/pp1"
cluster_mpirun node1:1,node2:1 -np 2 bin/bench_pingpong | tee "$WORK/pp2"
for layout in "1 4" "2 2"; do
  read -r nodes rpn <<<"$layout"
  CLUSTER_RANKS_PER_NODE=$rpn train 4 "$WORK/n$nodes" "${model[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
done
$PY - "$WORK" <<'PYEOF'
import json, re, statistics, sys
w = sys.argv[1]
def run(d):
    steps = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl") if '"loss"' in l][2:]
    step = statistics.fmean(s["step_s"] for s in steps)
    comm = statistics.fmean(s["comm_s"] for s in steps)
    tok = statistics.fmean(s["tokens_per_s"] for s in steps)
    nbytes = statistics.fmean(sum(sum(op.values()) for op in s["comm_bytes"].values()) for s in steps)
    return step, comm, tok, nbytes
def link(f):
    m = re.search(r"latency ([0-9.]+) us.*bandwidth ([0-9.]+) MB/s", open(f).read())
    return float(m.group(1)), float(m.group(2)) * 1e6
for name, d, pp in (("1 node x 4 ranks", "n1", "pp1"), ("2 nodes x 2 ranks", "n2", "pp2")):
    step, comm, tok, nbytes = run(d)
    lat, bw = link(f"{w}/{pp}")
    print(f"{name}: {tok:.0f} tokens/s, step {1e3 * step:.1f} ms, communication {1e3 * comm:.1f} ms "
          f"({comm / step:.0%} of the step); rank 0 moved {nbytes / 1e6:.2f} MB/step, "
          f"{1e3 * nbytes / bw:.1f} ms at the link's {bw / 1e6:.0f} MB/s ({lat:.0f} us latency)")
r = run("n2")[2] / run("n1")[2]
print(f"tokens/s ratio, 2 nodes / 1 node: {r:.2f}")
PYEOF
