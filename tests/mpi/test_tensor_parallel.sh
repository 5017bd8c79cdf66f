# Tensor parallelism changes nothing but speed and memory: 10 steps of global batch 8 on 1 rank equal the same
# steps with tp 2 on 2 ranks, tp 2 x 2 replicas on 4 ranks (ZeRO 2, and ZeRO 3 gathering each rank's parts), tp 2
# x one 2-stage pipeline on 4 ranks, and tp 2 x a 1-stage beside a 2-stage pipeline on 6 ranks; a tensor-parallel
# checkpoint resumes as pipelines without it.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
reference
one="--parallel.template=one: wte, wpe, h.0-h.1, ln_f"
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
against_ref 2 "tp 2" --parallel.tp_size=2
against_ref 4 "tp 2 x 2 replicas, ZeRO 2" --parallel.tp_size=2 --optim.zero=2
against_ref 4 "tp 2 x 2 replicas, ZeRO 3" --parallel.tp_size=2 --optim.zero=3
against_ref 4 "tp 2 x one 2-stage pipeline, GPipe" --parallel.tp_size=2 "$two" --parallel.pipelines=two \
  --parallel.microbatches=two:4 --parallel.schedule=gpipe
against_ref 6 "tp 2 x (1-stage + 2-stage pipelines), ZeRO 0" --parallel.tp_size=2 "$one" "$two" \
  --parallel.pipelines=one,two --parallel.microbatches=one:2,two:2 --optim.zero=0

echo "== a tp 2 x 2 run killed at step 12 resumes from step 10 as a 1-stage and a 2-stage pipeline"
args=(--train.steps=20 --train.global_batch=8 --train.micro_batch=2 --ckpt.every=5)
train 1 "$WORK/ref20" "${args[@]}" >"$WORK/ref20.log" 2>&1 || { cat "$WORK/ref20.log"; exit 1; }
set +e
YUANLM_KILL_AT=12 timeout 60 mpirun -x YUANLM_KILL_AT -np 4 bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/resumed" "${args[@]}" --parallel.tp_size=2 >/dev/null 2>&1
set -e
train 3 "$WORK/resumed" "${args[@]}" "$one" "$two" --parallel.pipelines=one,two --parallel.microbatches=one:2,two:2 \
  >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep "resumed from $WORK/resumed/ckpt/step_0000010: step 10, written by 4 ranks" "$WORK/log"
compare "$WORK/ref20" "$WORK/resumed" 1e-5 1e-5
