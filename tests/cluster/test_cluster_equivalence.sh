# shellcheck shell=bash
# Nodes change nothing but speed: 10 steps of global batch 8 on 1 rank equal the same steps spread over the nodes
# of the test cluster (tests/cluster/lib.sh: TCP between nodes, shared memory inside one), within 1e-5: data
# parallel with ZeRO 1 over 4 nodes and ZeRO 3 over 2, tp 2 inside each node with data parallelism across 2, a
# 2-stage pipeline with one stage per node, and a 1-stage beside a 2-stage pipeline on 3 nodes. (That the ranks
# land on the nodes asked for and talk TCP between them: test_cluster_lib.sh.)
# Exit 77 (skipped) where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
cluster_up 4

make_corpus "$WORK/corpus" 2 4000 64
reference
one="--parallel.template=one: wte, wpe, h.0-h.1, ln_f"
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
CLUSTER_RANKS_PER_NODE=1 against_ref 4 "data parallel, ZeRO 1, one rank on each of 4 nodes" --optim.zero=1
against_ref 4 "data parallel, ZeRO 3, 2 nodes of 2 ranks" --optim.zero=3
against_ref 4 "tp 2 inside each of 2 nodes, data parallel across them" --parallel.tp_size=2
CLUSTER_RANKS_PER_NODE=1 against_ref 2 "a 2-stage pipeline, one stage per node" "$two" --parallel.pipelines=two \
  --parallel.microbatches=two:4
CLUSTER_RANKS_PER_NODE=1 against_ref 3 "a 1-stage and a 2-stage pipeline on 3 nodes" "$one" "$two" \
  --parallel.pipelines=one,two --parallel.microbatches=one:1,two:3
