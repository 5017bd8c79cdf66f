# shellcheck shell=bash
# Checkpoint-and-requeue through a real (private, one-node) SLURM with jobs/train.sbatch:
#  time-limit  1 rank, --time=1 and the script's own `#SBATCH --signal=USR1@120` (no B:): SLURM's time-limit
#              warning reaches the rank directly (not via the batch shell's trap); yuanlm checkpoints and the
#              job ends with exit 75 (NO_REQUEUE=1 here, so that this job does not go round again).
#  mpirun      1 rank, LAUNCHER=mpirun --time=1 SIGNAL_LEAD=50: the fallback's watchdog sends SIGUSR1 to mpirun
#              ~10 s in; same checkpoint and exit 75.
#  requeue     2 ranks, srun: `scancel --signal=USR1` on the running job (the same delivery as the time-limit
#              warning without B:, but at a moment the test chooses: the controller's 30 s time-limit tick makes
#              the warning land anywhere in a 30 s window) -> checkpoint, exit 75, `scontrol requeue` by the
#              script, SLURM restarts the job (same id, Restarts=1) and it resumes from the checkpoint to the end.
# The private SLURM sets AuthInfo=cred_expire=10 so a requeued job may start again after ~10 s (default 120).
# Exit 77 (skipped) where SLURM cannot run.
source "$(dirname "$0")/lib.sh"
source tests/slurm/lib.sh
slurm_up
REPO=$PWD
make_corpus "$WORK/corpus" 2 6000 4000
mkdir -p "$WORK/logs"
# A smaller tiny deck: ~70 ms per step on 2 ranks here.
model=(--model.seq_len=64 --train.global_batch=8 --train.micro_batch=4 --data.train="$WORK/corpus/shard_000.h5"
       --data.val="$WORK/corpus/shard_001.h5" --train.eval_batches=1 --train.log_every=10)
submit() {  # NAME SBATCH_OPTS... -- TRAIN_OVERRIDES...: prints the job id
  local name=$1 opts=()
  shift
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  YUANLM_HOME=$REPO sbatch --parsable --chdir="$WORK" --job-name="$name" --cpus-per-task=1 "${opts[@]}" \
    jobs/train.sbatch "$REPO/input/tiny.ini" "${model[@]}" "$@"
}
check_stopped() {  # NAME ID LAUNCHER: the job ended with exit 75 after a checkpoint, not requeued
  local name=$1 id=$2 l=$3 out run step
  out=$WORK/logs/$name-$id.out run=$WORK/runs/$name-$id
  echo "== $name (job $id, $l)"
  cat "$out"
  [ "$(job_field "$id" ExitCode)" = 75:0 ] || { echo "exit code $(job_field "$id" ExitCode), expected 75:0"; exit 1; }
  step=$(sed -n 's/.*stopped by a signal after step \([0-9]*\).*/\1/p' "$out" | head -1)
  [ -n "$step" ] && [ -d "$run/ckpt/step_$(printf %07d "$step")" ] || { echo "no checkpoint for step '$step'"; exit 1; }
  grep -q "launcher $l" "$out"
  grep -q "not requeued" "$out"
  if grep -q "got SIGUSR1; passing it" "$out"; then echo "the batch shell got the signal"; exit 1; fi
}

# The two 1-rank jobs run side by side on the 2 cores; the requeue job follows.
t0=$(date +%s)
limit=$(submit time-limit --ntasks-per-node=1 --time=1 --export=ALL,NO_REQUEUE=1 -- --train.steps=1000000)
fallback=$(submit mpirun-fallback --ntasks-per-node=1 --time=1 --export=ALL,NO_REQUEUE=1,LAUNCHER=mpirun,SIGNAL_LEAD=50 -- \
  --train.steps=1000000)
wait_jobs 100 "$limit" "$fallback"
echo "time-limit and mpirun jobs ended after $(($(date +%s) - t0)) s"
check_stopped time-limit "$limit" srun
check_stopped mpirun-fallback "$fallback" mpirun

id=$(submit requeue --ntasks-per-node=2 --time=5 -- --train.steps=80)
requeue_and_check requeue "$id" 80
