# shellcheck shell=bash
# A lost node, outside SLURM: `HOSTFILE=FILE bash jobs/train.sbatch` over 4 nodes of 2 ranks of the test cluster
# (mpirun through the cluster's rsh agent). A node other than the launching one is killed at a random step; the
# script finds it gone, re-plans on the survivors (yuanlm plan --replan) and relaunches at once: the job completes
# every step, its losses and final weights equal the uninterrupted 1-rank run's within 1e-5, and no failure loses
# more than the checkpoint interval. Here data parallelism survives two failures in one job (8 -> 6 -> 4 ranks,
# the micro-batch 3 -> 2 -> 3 so that the global batch of 24 still divides); test_elastic_layouts.sh: tp 2 and a
# heterogeneous pipeline job. Exit 77 where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/elastic_lib.sh
cluster_up 4
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=16 --train.global_batch=24 --train.micro_batch=3 --optim.zero=1)
train 1 "$WORK/ref" --data.val= --train.log_every=1 "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

echo "== data parallel on 8 ranks, two nodes lost one after the other"
elastic_start dp "${args[@]}"
kill_at_random dp 2
kill_at_random dp 2
elastic_check dp 2 4 2

