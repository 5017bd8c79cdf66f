# shellcheck shell=bash
# jobs/train.sbatch on a real (private, one-node) SLURM: the tiny deck on the CPU backend under 2 ranks, once
# with the default launcher (srun --mpi=pmix) and once with the mpirun fallback (LAUNCHER=mpirun). Each job must
# finish with exit 0 (sbatch --wait returns the job's exit code), leave a checkpoint, metrics, config.ini and the
# per-job log in its run.dir under runs/<job name>-<job id>, and the SLURM output in logs/.
# Exit 77 (skipped) where SLURM cannot run: not root, or the daemons do not start (tests/slurm/start.sh).
source "$(dirname "$0")/lib.sh"
source tests/slurm/lib.sh
slurm_up
REPO=$PWD
make_corpus "$WORK/corpus" 2 20000 4000
mkdir -p "$WORK/logs"
steps=12
# Submitted from $WORK (--chdir): logs/ and runs/ land there; the binary comes from YUANLM_HOME.
submit() {  # NAME [env assignments...]: prints the job id; the job's exit code is checked by sbatch --wait
  local name=$1
  shift
  env YUANLM_HOME="$REPO" "$@" sbatch --parsable --wait --chdir="$WORK" --job-name="$name" --ntasks-per-node=2 \
    --cpus-per-task=1 --time=5 jobs/train.sbatch "$REPO/input/tiny.ini" --data.train="$WORK/corpus/shard_000.h5" \
    --data.val="$WORK/corpus/shard_001.h5" --train.steps=$steps --train.log_every=4 --train.eval_batches=2
}
for launcher in srun mpirun; do
  name=slurm-train-$launcher
  echo "== $name"
  start=$(date +%s)
  set +e
  if [ $launcher = srun ]; then id=$(submit "$name"); else id=$(submit "$name" LAUNCHER=mpirun); fi
  rc=$?
  set -e
  id=$(echo "$id" | head -1)
  out=$WORK/logs/$name-$id.out
  run=$WORK/runs/$name-$id
  echo "job $id: exit $rc in $(($(date +%s) - start)) s"
  cat "$out"
  [ "$rc" -eq 0 ] || { echo "sbatch --wait returned $rc"; exit 1; }
  grep -q "launcher $launcher" "$out" || { echo "not launched with $launcher"; exit 1; }
  grep -q "parallel: 2 ranks" "$out" || { echo "not 2 ranks"; exit 1; }
  grep -q "done: $steps steps" "$out"
  [ -f "$run/ckpt/step_$(printf %07d $steps)/state.json" ] || { echo "no checkpoint in $run/ckpt"; ls -R "$run"; exit 1; }
  [ -f "$run/config.ini" ] && grep -q "dir = runs/$name-$id" "$run/config.ini"
  n=$(grep -c '"loss"' "$run/metrics.jsonl")
  [ "$n" -eq $steps ] || { echo "$n training lines in metrics.jsonl, expected $steps"; exit 1; }
  grep -q '"val_loss"' "$run/metrics.jsonl"
  # the run.dir copy of the output, the incarnation record and the end-of-job summary
  grep -q "done: $steps steps" "$run/job-$id.log"
  grep -q "^summary: $steps steps" "$run/job-$id.log"
  awk -F'\t' -v id="$id" -v l=$launcher '$1 == id && $2 == 0 && $5 == 0 && $6 == l && $7 == 2 { ok = 1 } END { exit !ok }' \
    "$run/jobs.tsv" || { echo "bad jobs.tsv:"; cat "$run/jobs.tsv"; exit 1; }
done
echo "both launchers trained, checkpointed and logged under SLURM"
