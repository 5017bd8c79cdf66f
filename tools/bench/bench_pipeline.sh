#!/usr/bin/env bash
# Pipeline schedules on the CPU backend: the bubble measured by the trainer (each stage's share of the step spent
# waiting for its neighbours, averaged over the stages) against the theory (p-1)/(m+p-1) for a few (p, m), and
# the activation memory each stage allocates under 1F1B and GPipe. One rank per stage, one thread each, on a
# model whose stages the auto:p template balances (8 blocks of width 128, seq 64, vocab 256: the classifier is
# light); the bubble is the mean of steps 3-8. Where ranks outnumber cores they take turns on them, and the
# measured bubble also holds the time a rank waited for a core: the script says so on those lines.
source "$(dirname "$0")/../../tests/mpi/lib.sh"
export OMPI_MCA_mpi_yield_when_idle=1  # a rank waiting in MPI yields its core instead of spinning
make_corpus "$WORK/corpus" 1 60000 256
model=(--model.n_layer=8 --model.n_head=4 --model.n_embd=128 --model.seq_len=64 --model.vocab_size=256
       --train.device=cpu --train.micro_batch=2 --train.steps=8 --train.log_every=8 --optim.eps=1e-5)
cores=$(nproc --all)
echo "bubble: measured by the trainer vs (p-1)/(m+p-1); $cores cores"
for pm in "2 1" "2 2" "2 4" "2 8" "3 6" "4 4" "4 8"; do
  read -r p m <<<"$pm"
  for schedule in 1f1b gpipe; do
    run="$WORK/p$p-m$m-$schedule"
    mpirun -np "$p" bin/yuanlm train "${model[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$run" \
      "--parallel.template=t: auto:$p" --parallel.pipelines=t --parallel.microbatches="t:$m" \
      --train.global_batch=$((2 * m)) --parallel.schedule=$schedule >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
    $PY - "$run/metrics.jsonl" "$p" "$m" "$schedule" "$cores" <<'PYEOF'
import json, sys
path, p, m, schedule, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
steps = [json.loads(l) for l in open(path) if '"bubble"' in l]
measured = sum(s["bubble"] for s in steps[2:]) / len(steps[2:])
theory = (p - 1) / (m + p - 1)
note = f"  ({p} ranks on {cores} cores: shared)" if p > cores else ""
ratio = f"{measured / theory:.2f} x theory" if theory > 0 else "-"
print(f"p={p} m={m} {schedule:5s}: bubble {100 * measured:5.1f}%, theory {100 * theory:5.1f}%, {ratio}{note}")
PYEOF
  done
done
echo "activations per stage, 1F1B vs GPipe (p=4, m=8; bin/yuanlm plan, what the program allocates: tests/test_program.cpp)"
for schedule in 1f1b gpipe; do
  bin/yuanlm plan "${model[@]}" --train.global_batch=16 "--parallel.template=t: auto:4" --parallel.pipelines=t \
    --parallel.microbatches=t:8 --parallel.schedule=$schedule --data.train="$WORK/corpus/*.h5" |
    grep -o "activations [0-9.]* [KMG]*i*B of [0-9]* micro-batch[es]* in flight" | sed "s/^/  $schedule: /"
done
