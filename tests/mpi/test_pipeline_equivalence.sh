# Pipelines change nothing but speed and memory: 10 steps of global batch 8 on 1 rank equal the same steps on a
# 2-stage pipeline (2 ranks), two 2-stage pipelines cut at different modules (4 ranks), and a 1-stage pipeline
# beside a 2-stage one with other micro-batch counts (3 ranks), under both schedules and ZeRO 0, 1 and 2. The
# tiny model's modules are wte, wpe, h.0, h.1, ln_f.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
reference
one="--parallel.template=one: wte, wpe, h.0-h.1, ln_f"
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
cut="--parallel.template=cut: wte, wpe | h.0-h.1, ln_f"
MUST_LOG=bubble  # the step line shows it
for schedule in 1f1b gpipe; do
  against_ref 2 "one 2-stage pipeline" "$two" --parallel.pipelines=two --parallel.microbatches=two:4 \
    --parallel.schedule=$schedule
  against_ref 4 "two 2-stage pipelines" "$two" "$cut" --parallel.pipelines=two,cut \
    --parallel.microbatches=two:2,cut:2 --parallel.schedule=$schedule
  against_ref 3 "a 1-stage and a 2-stage pipeline" "$one" "$two" --parallel.pipelines=one,two \
    --parallel.microbatches=one:1,two:3 --parallel.schedule=$schedule
done
against_ref 3 "a 1-stage and a 2-stage pipeline, ZeRO 0" "$one" "$two" --parallel.pipelines=one,two \
  --parallel.microbatches=one:3,two:1 --optim.zero=0
against_ref 4 "a 4-stage pipeline balanced by cost, ZeRO 2" "--parallel.template=four: auto:4" \
  --parallel.pipelines=four --parallel.microbatches=four:4 --optim.zero=2 --parallel.schedule=gpipe

echo "== eval of a heterogeneous pipeline run reproduces its val_loss on the same windows, on one rank"
train 3 "$WORK/val" "${equiv[@]}" "$one" "$two" --parallel.pipelines=one,two --parallel.microbatches=one:1,two:3 \
  --data.val="$WORK/corpus/*.h5" --train.eval_batches=3 >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
bin/yuanlm eval --checkpoint "$WORK/val" --json >"$WORK/eval.out"
tail -1 "$WORK/eval.out"
$PY - "$WORK/eval.out" "$WORK/val/metrics.jsonl" <<'PYEOF'
import json, sys
out = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert out["windows"] == 12, out  # 3 batches x micro-batch 2 x 2 pipelines
got = out["val_loss"]
trained = json.loads(open(sys.argv[2]).readlines()[-1])["val_loss"]
rel = abs(got - trained) / trained
print(f"val_loss {got!r} vs {trained!r}: relative difference {rel:.2e} (tolerance 1e-6)")
sys.exit(0 if rel <= 1e-6 else 1)
PYEOF
