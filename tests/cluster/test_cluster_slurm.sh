# shellcheck shell=bash
# SLURM across the nodes of the test cluster (tests/cluster/lib.sh: slurmctld on node1, a slurmd on each node, one
# munged): `sbatch --nodes=2 --ntasks-per-node=2 jobs/train.sbatch DECK` runs 4 ranks over 2 nodes with
# `srun --mpi=pmix`; `scancel --signal=USR1` (the delivery of the time-limit warning, --signal=USR1@120, at a
# moment the test chooses) reaches the ranks on both nodes, which checkpoint and exit 75; the script's
# `scontrol requeue` sends the job round again and it resumes to the end. Then `jobs/sweep --nodes 1,2` runs a
# strong-scaling series on 1 and 2 nodes and tools/scaling.py reads it. Exit 77 (skipped) where namespaces cannot
# be made or SLURM cannot run.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/slurm/lib.sh
source tests/cluster/lib.sh
cluster_up 2
cluster_slurm_up
REPO=$PWD
make_corpus "$WORK/corpus" 2 4000 64
mkdir -p "$WORK/logs"
# The tiny model of tests/mpi/lib.sh over the deck's.
data=("${TINY[@]}" --data.train="$WORK/corpus/shard_000.h5" --data.val="$WORK/corpus/shard_001.h5"
      --train.eval_batches=1)

name=cluster-requeue
id=$(slurm_client env YUANLM_HOME="$REPO" sbatch --parsable --chdir="$WORK" --job-name=$name --nodes=2 \
  --ntasks-per-node=2 --cpus-per-task=1 --time=5 jobs/train.sbatch "$REPO/input/tiny.ini" "${data[@]}" \
  --train.global_batch=8 --train.micro_batch=2 --train.steps=40)
requeue_and_check $name "$id" 40
out=$WORK/logs/$name-$id.out
grep -q "on node\[1-2\]: 2 node(s), 4 rank(s)" "$out" || { echo "not 4 ranks on node1 and node2"; exit 1; }
grep -q "launcher srun" "$out"
[ "$(grep -c "parallel: 4 ranks" "$out")" -eq 2 ] || { echo "both incarnations should run 4 ranks"; exit 1; }

echo "== jobs/sweep over 1 and 2 nodes of 2 ranks"
slurm_client env SWEEP_ROOT="$WORK/sweeps" jobs/sweep --nodes 1,2 --ranks-per-node 2 --mode strong --steps 4 \
  --global-batch 8 --micro-batch 2 --time 5 --name nodes --wait --poll 1 input/tiny.ini "${data[@]}" \
  >"$WORK/sweep.log" 2>&1 || { cat "$WORK/sweep.log" "$WORK"/sweeps/nodes/logs/*; exit 1; }
cat "$WORK/sweep.log"
grep -q "strong scaling, 4 rank(s) on 2 node(s)" "$WORK/sweep.log"
grep -q "on node\[1-2\]: 2 node(s), 4 rank(s)" "$WORK"/sweeps/nodes/logs/nodes-strong-r4-*.out
