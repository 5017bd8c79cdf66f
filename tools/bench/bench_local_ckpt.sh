#!/usr/bin/env bash
# The fast checkpoint tier's cost on the step (issue 24's goal: at most 5% at ckpt.local_every=1), for the tiny deck
# and gpt-small on the CPU backend, 2 ranks on one node (own copies in /dev/shm; no partner exchange on one node).
# gpt-small runs at seq_len 128, one sequence per rank, so that a step takes seconds on a laptop-sized machine; the
# shard written is gpt-small's whole ZeRO-1 half (about 750 MB per rank). Two measures, over steps 3-N (the first
# steps warm up, and the first two local checkpoints create the files the later ones overwrite in place):
#  - in the same steps: the share of each step and its checkpoint that the checkpoint took on the training thread
#    (metrics local_ckpt_s against step_s + local_ckpt_s, rank 0, the median): what the tier's copy costs, measured
#    beside the step it follows, so that a change of the machine's speed moves both alike;
#  - in the same run, what the tier costs beside its copy (its thread's sealing of the copy, the caches): with
#    ckpt.local_every=2, each step that follows a checkpoint against the step after it, which follows none (pairs
#    from step 7 on, the median of the pairs' differences of step_s);
#  - across runs: tokens per second of step and checkpoint with ckpt.local_every=1 against 0 (two runs each way,
#    interleaved off, on, off, on; the median): the copy plus whatever the tier costs besides (its thread, the
#    caches), but only as steady as the machine: on the 2-core VM a ratio of two runs moves by 5-10% with nothing
#    changed.
# What the tier costs is CPU (the one copy of the shard into its mapped tmpfs file with the CRC-32C taken on the
# way): where the ranks' threads take every core it comes out of the step, and so does any other work's, so the load
# is printed with the ratios. YUANLM=PATH benchmarks another build (before/after).
source "$(dirname "$0")/../../tests/mpi/lib.sh"
YUANLM=${YUANLM:-bin/yuanlm}
echo "local checkpoints every step vs none (goal: at most 5% overhead); $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# bench DECK VOCAB STEPS ARGS...: prints both measures for DECK (random tokens of its vocabulary).
bench() {
  local deck=$1 vocab=$2 steps=$3 every run
  shift 3
  make_corpus "$WORK/corpus" 1 60000 "$vocab"
  for run in 1 2; do
    for every in 0 1; do
      mpirun -np 2 "$YUANLM" train "input/$deck.ini" --data.train="$WORK/corpus/*.h5" --data.val= \
        --train.device=cpu --train.steps="$steps" --train.log_every="$steps" --ckpt.every=0 \
        --ckpt.local_every=$every --run.dir="$WORK/$deck-$every-$run" "$@" >"$WORK/log" 2>&1 ||
        { cat "$WORK/log"; exit 1; }
    done
  done
  mpirun -np 2 "$YUANLM" train "input/$deck.ini" --data.train="$WORK/corpus/*.h5" --data.val= \
    --train.device=cpu --train.steps=$((steps + 6)) --train.log_every="$steps" --ckpt.every=0 \
    --ckpt.local_every=2 --run.dir="$WORK/$deck-2-1" "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  rm -rf "$WORK/corpus"
  $PY - "$deck" "$WORK" <<'PYEOF'
import json, statistics, sys
deck, work = sys.argv[1], sys.argv[2]
def records(every, run):
    return [json.loads(l) for l in open(f'{work}/{deck}-{every}-{run}/metrics.jsonl') if '"loss"' in l]
def steps(every):
    return [r for run in (1, 2) for r in records(every, run)[2:]]
def tps(every):
    return statistics.median(r['tokens_per_s'] * r['step_s'] / (r['step_s'] + r['local_ckpt_s']) for r in steps(every))
on = steps(1)
if any('local_ckpt_s' not in r for r in on):
    sys.exit(f'{deck}: {work}: metrics.jsonl without local_ckpt_s: a build from before 2026-11-27 does not report '
             'the copy, and its tokens_per_s leaves it out')
share = statistics.median(r['local_ckpt_s'] / (r['step_s'] + r['local_ckpt_s']) for r in on)
copy = statistics.median(r['local_ckpt_s'] for r in on)
a, b = tps(0), tps(1)
print(f'{deck:10s}: in the same steps, the checkpoint {1000 * copy:.0f} ms of step and checkpoint '
      f'{1000 * statistics.median(r["step_s"] + r["local_ckpt_s"] for r in on):.0f} ms: '
      f'{100 * share:.1f}% overhead = {share / 0.05:.2f} x the goal (5%)')
alt = {r['step']: r['step_s'] for r in records(2, 1)}
beside = statistics.median((alt[k] - alt[k + 1]) / alt[k + 1] for k in range(7, max(alt), 2))
total = share + max(beside, 0.0)  # a step after a checkpoint measured faster is noise, not a saving
print(f'{"":10s}  beside the copy, in the same run: the step after a checkpoint {100 * beside:+.1f}% against the '
      f'step after none; with the copy: {100 * total:.1f}% = {total / 0.05:.2f} x the goal (5%)')
print(f'{"":10s}  across runs: {a:9.0f} tokens/s without, {b:9.0f} with: {b / a:.3f} ({100 * (1 - b / a):+.1f}% overhead)')
PYEOF
}
bench tiny 4000 20 --train.global_batch=16 --train.micro_batch=8
bench gpt-small 50304 12 --model.seq_len=128 --train.global_batch=2 --train.micro_batch=1 --optim.warmup_steps=2
