# shellcheck shell=bash
# A 1/2/4-rank CPU scaling sweep (strong: fixed global batch; weak: fixed per-rank batch) with jobs/sweep,
# then tools/scaling.py: the table (Markdown and CSV) and both PNGs must appear, with sane numbers. Through the
# private one-node SLURM (jobs/sweep --wait; 4 ranks on 2 cores with --overcommit) where it can run; otherwise
# through plain mpirun (jobs/sweep --local), saying so -- this test does not skip.
source "$(dirname "$0")/lib.sh"
source tests/slurm/lib.sh
make_corpus "$WORK/corpus" 2 6000 4000
export SWEEP_ROOT=$WORK/sweeps
# 4 ranks on 2 cores: ranks waiting in MPI yield the core instead of spinning (mpirun does this by itself when
# it sees oversubscription; under srun --overcommit Open MPI cannot tell).
export OMPI_MCA_mpi_yield_when_idle=1
args=(--ranks 1,2,4 --steps 8 --name t input/tiny.ini --model.seq_len=64 --train.micro_batch=4 --train.global_batch=8
      --data.train="$WORK/corpus/shard_000.h5" --data.val="$WORK/corpus/shard_001.h5" --train.eval_batches=1
      --train.log_every=4)

# dry run: six sbatch commands, nothing created
jobs/sweep --dry-run "${args[@]}" | tee "$WORK/dry.txt"
[ "$(grep -c '^sbatch ' "$WORK/dry.txt")" -eq 6 ] || { echo "expected 6 sbatch commands"; exit 1; }
grep -q -- '--ntasks=4 .*--train.global_batch=8 --train.micro_batch=2 ' "$WORK/dry.txt"   # strong, 4 ranks
grep -q -- '--ntasks=4 .*--train.global_batch=16 --train.micro_batch=4 ' "$WORK/dry.txt"  # weak, 4 ranks
[ ! -e "$SWEEP_ROOT" ] || { echo "--dry-run created $SWEEP_ROOT"; exit 1; }

start=$(date +%s)
set +e
if slurm_try_up; then
  echo "== sweep through SLURM"
  jobs/sweep --wait --poll 1 --time 5 --cpus-per-task 1 --sbatch-opt=--overcommit "${args[@]}" | tee "$WORK/sweep.txt"
  rc=${PIPESTATUS[0]}
  grep -c '^submitted ' "$WORK/sweep.txt" | grep -qx 6 || { echo "expected 6 submitted jobs"; exit 1; }
else
  echo "NOTE: SLURM cannot run here; the sweep runs through plain mpirun (jobs/sweep --local) instead"
  trap 'rm -rf "$WORK"' EXIT
  jobs/sweep --local "${args[@]}" | tee "$WORK/sweep.txt"
  rc=${PIPESTATUS[0]}
fi
set -e
echo "sweep took $(($(date +%s) - start)) s, exit $rc"
[ "$rc" -eq 0 ] || { for f in "$SWEEP_ROOT"/t/logs/*; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

s=$SWEEP_ROOT/t
for f in scaling.md scaling.csv strong_scaling.png weak_scaling.png manifest.tsv; do
  [ -s "$s/$f" ] || { echo "missing $s/$f"; exit 1; }
done
cat "$s/scaling.md"
$PY - "$s" <<'PYEOF'
import csv, sys
s = sys.argv[1]
rows = list(csv.DictReader(open(f"{s}/scaling.csv")))
assert len(rows) == 6, rows
for mode in ("strong", "weak"):
    rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: int(r["ranks"]))
    assert [int(r["ranks"]) for r in rs] == [1, 2, 4], rs
    assert abs(float(rs[0]["speedup"]) - 1) < 1e-9 and abs(float(rs[0]["efficiency"]) - 1) < 1e-9
    for r in rs:
        tps, st, eff = float(r["tokens_per_s"]), float(r["step_s"]), float(r["efficiency"])
        assert tps > 0 and 0 < st < 60, r
        assert 0 < eff < 3, f"{mode} r{r['ranks']}: efficiency {eff}"
        assert int(r["averaged"]) == 6, r  # 8 steps, the first 2 left out
        gb = int(r["global_batch"])
        assert gb == (8 if mode == "strong" else 4 * int(r["ranks"])), r
        # tokens/s is global_batch x seq_len / step time
        assert abs(tps - gb * 64 / st) / tps < 1e-3, r
for png in ("strong_scaling.png", "weak_scaling.png"):
    b = open(f"{s}/{png}", "rb").read()
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and len(b) > 10000, png
print("table and plots OK")
PYEOF
