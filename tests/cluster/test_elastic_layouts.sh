# shellcheck shell=bash
# A lost node under the other layouts (test_elastic_hostfile.sh: data parallelism, two failures): HOSTFILE mode
# over 4 nodes of 2 ranks, a node other than the launching one killed at a random step, the job relaunched on the
# survivors completes every step with the uninterrupted 1-rank run's losses and weights (1e-5), losing at most the
# checkpoint interval. tp 2 inside each node: 4 replicas become 3 (micro-batch 3 -> 2). A heterogeneous job, a
# 1-stage pipeline beside 2-stage ones (one, two, two, two, one on ranks 0 | 1-2 | 3-4 | 5-6 | 7): the pipelines
# with a rank on the lost node are rebuilt from the 1-stage template or dropped, the others keep theirs, and the
# micro-batches are shared again. Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/elastic_lib.sh
cluster_up 4
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=16 --train.global_batch=24 --train.micro_batch=3)
train 1 "$WORK/ref" --data.val= --train.log_every=1 "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

echo "== tp 2 inside each node, 4 replicas; a node lost"
elastic_start tp "${args[@]}" --parallel.tp_size=2
kill_at_random tp 2
elastic_check tp 1 6 3

echo "== one, two, two, two, one; a node lost"
elastic_start hetero "${args[@]}" "--parallel.template=one: wte, wpe, h.0-h.1, ln_f" \
  "--parallel.template=two: wte, wpe, h.0 | h.1, ln_f" --parallel.pipelines=one,two,two,two,one \
  --parallel.microbatches=one:1,two:2
kill_at_random hetero 2
elastic_check hetero 1 6 3
grep -Eq "had ranks on a lost node: (re-formed from template one|dropped)" "$WORK/hetero.log" ||
  { echo "hetero: no pipeline re-formed or dropped"; exit 1; }
