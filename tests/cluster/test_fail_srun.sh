# shellcheck shell=bash
# A partition under SLURM: `sbatch --nodes=2 --ntasks-per-node=2 jobs/train.sbatch` (srun --mpi=pmix) across the
# test cluster, node 2's link set down mid-step. Within dist.timeout_s + 30 s every rank on both nodes has ended,
# srun reports a non-zero exit, and the one "error:" line names node 2's ranks as silent. (SLURM itself keeps the
# job COMPLETING until it declares node 2 down: its slurmstepd there cannot report.) Exit 77 where namespaces
# cannot be made or SLURM cannot run.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/slurm/lib.sh
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
cluster_slurm_up
make_corpus "$WORK/corpus" 2 4000 64
mkdir -p "$WORK/logs"
# ELASTIC=0: the failure itself is under test here, not the relaunch on the survivors (test_elastic_slurm.sh).
id=$(slurm_client env YUANLM_HOME="$PWD" ELASTIC=0 sbatch --parsable --chdir="$WORK" --job-name=cut --nodes=2 \
  --ntasks-per-node=2 --cpus-per-task=1 --time=5 jobs/train.sbatch "$PWD/input/tiny.ini" "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --data.val= --train.global_batch=8 --train.micro_batch=2 --train.steps=100000 \
  --train.log_every=1 --ckpt.every=0 --dist.timeout_s="$TIMEOUT")
out=$WORK/logs/cut-$id.out
steps() { if [ -f "$out" ]; then awk '/^step/ {n++} END {print n + 0}' "$out"; else echo 0; fi; }
for _ in $(seq 600); do [ "$(steps)" -ge 3 ] && break; sleep 0.1; done
[ "$(steps)" -ge 3 ] || { cat "$out"; echo "the job did not start"; exit 1; }

echo "== node 2 cut off for good under srun"
node_partition 2
start=$(date +%s)
ranks() { for k in 1 2; do rank_pids "$k"; done; }
while [ -n "$(ranks)" ] && [ $(($(date +%s) - start)) -le $((TIMEOUT + 30)) ]; do sleep 0.5; done
[ -z "$(ranks)" ] || { cat "$out"; echo "ranks left after $((TIMEOUT + 30)) s: $(ranks | paste -sd' ')"; exit 1; }
echo "every rank gone after $(($(date +%s) - start)) s"
# Rank 0 ends through MPI_Abort, which has slurmstepd kill the node's tasks: srun reports rank 0 as exited with
# code 1 or, when the kill reaches it first, as killed together with rank 1. Either is a failed step.
failed='^srun: error: node1: tasks? 0(-1)?: (Exited with exit code [1-9]|Killed)'
for _ in $(seq 100); do grep -Eq "$failed" "$out" && break; sleep 0.1; done
grep -Eq "$failed" "$out" || { cat "$out"; echo "no non-zero exit"; exit 1; }
cp "$out" "$WORK/srun.log"
one_error srun "^error: \[rank 0@node1\] no progress for [0-9]+ s: waiting in [a-z_]+ on group .*dist.timeout_s \
$TIMEOUT; world ranks 2-3 on node2 do not answer a liveness ping within [0-9.]+ s: stopped, dead or cut off"
