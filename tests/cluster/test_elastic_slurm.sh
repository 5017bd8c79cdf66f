# shellcheck shell=bash
# A lost node under SLURM: `sbatch --nodes=4 --ntasks-per-node=2 jobs/train.sbatch` (srun --mpi=pmix, #SBATCH
# --no-kill) across the test cluster, a node other than the batch node killed at a random step (its slurmd, its
# ranks and every other process in it, its interface removed). The script's probes (srun -w NODE true, 5 s) find it
# gone, and the job relaunches at once on the 3 survivors in the same allocation, completes every step with the
# uninterrupted 1-rank run's losses and weights (1e-5) and loses at most the checkpoint interval. SLURM itself learns
# of the node only after SlurmdTimeout; the test then marks it down, as a health check would, and the job
# completes. Before that, a job whose ranks fail on their own (no data) on 4 live nodes: every node answers the
# probes, and the job ends with srun's own exit code, not relaunched. Exit 77 where namespaces cannot be made or
# SLURM cannot run.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/slurm/lib.sh
source tests/cluster/lib.sh
source tests/cluster/elastic_lib.sh
cluster_up 4
cluster_slurm_up
make_corpus "$WORK/corpus" 2 4000 64
mkdir -p "$WORK/logs"
args=(--train.steps=16 --train.global_batch=24 --train.micro_batch=3)
train 1 "$WORK/ref" --data.val= --train.log_every=1 "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

# submit NAME ARGS...: the 4-node job NAME of the tiny model with ARGS; prints its id.
submit() {
  local name=$1
  shift
  slurm_client env YUANLM_HOME="$PWD" PROBE_TIMEOUT=5 sbatch --parsable --chdir="$WORK" --job-name="$name" --nodes=4 \
    --ntasks-per-node=2 --cpus-per-task=1 --time=5 jobs/train.sbatch "$PWD/input/tiny.ini" "${TINY[@]}" --data.val= \
    --train.log_every=1 --dist.timeout_s=10 "${CKPT[@]}" "${args[@]}" "$@"
}

id=$(submit nodata --data.train="$WORK/missing/*.h5")
out=$WORK/logs/nodata-$id.out
wait_jobs 120 "$id" || { cat "$out"; exit 1; }
rc=$(sed -n 's/.*launcher exited \([0-9]*\) after.*/\1/p' "$out")
{ grep -q "every node answers: not a node failure; not relaunched" "$out" && ! grep -q "killing srun" "$out" &&
  [ "$(job_field "$id" JobState)" = FAILED ] && [ "$(job_field "$id" ExitCode)" = "$rc:0" ]; } ||
  { cat "$out"; echo "job $id (no data): $(job_field "$id" JobState), exit $(job_field "$id" ExitCode)"; exit 1; }
echo "no data: every node answers, not relaunched, exit $rc (srun's)"

name=elastic
id=$(submit $name --data.train="$WORK/corpus/*.h5")
out=$WORK/logs/$name-$id.out
for _ in $(seq 600); do [ -f "$out" ] && break; sleep 0.1; done
# kill_at_random and elastic_check read the job's log as $WORK/NAME.log, and its run.dir as $WORK/NAME.
ln -s "$out" "$WORK/$name.log"
ln -s "$WORK/runs/$name-$id" "$WORK/$name"
# The job is SLURM's: what stands for it here lives until its script has finished training (or the test's exit
# has removed the log with $WORK).
(while [ -f "$out" ] && ! grep -q "launcher exited 0" "$out"; do sleep 0.2; done) &
ELASTIC_JOB=$!
kill_at_random $name 2
elastic_wait $name
slurm_client scontrol update nodename="node${KILLED[0]}" state=down reason="killed by the test"
wait_jobs 60 "$id" || { cat "$out"; exit 1; }
[ "$(job_field "$id" JobState)" = COMPLETED ] && [ "$(job_field "$id" ExitCode)" = 0:0 ] ||
  { cat "$out"; echo "job $id: $(job_field "$id" JobState), exit $(job_field "$id" ExitCode)"; exit 1; }
grep -q "launcher srun" "$out"
elastic_verify $name 1 6 3
grep -q "relaunch 1 at once on 3 node(s)" "$out"
