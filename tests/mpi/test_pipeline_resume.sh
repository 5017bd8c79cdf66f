# Checkpoints hold the model whole whatever the layout: a run of two 2-stage pipelines stopped at step 12
# resumes from its step-10 checkpoint as plain data parallelism on 2 ranks and as a 1-stage plus a 2-stage
# pipeline on 3 ranks, and a data-parallel checkpoint resumes as a 2-stage pipeline; the following losses and
# the final weights match an uninterrupted run within floating-point tolerance.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
args=(--train.steps=20 --train.global_batch=8 --train.micro_batch=2 --ckpt.every=5)
one="--parallel.template=one: wte, wpe, h.0-h.1, ln_f"
two="--parallel.template=two: wte, wpe, h.0 | h.1, ln_f"
cut="--parallel.template=cut: wte, wpe | h.0-h.1, ln_f"
pipes4=("$two" "$cut" --parallel.pipelines=two,cut --parallel.microbatches=two:2,cut:2)
pipes3=("$one" "$two" --parallel.pipelines=one,two --parallel.microbatches=one:2,two:2)
pipes2=("$two" --parallel.pipelines=two --parallel.microbatches=two:4)
train 1 "$WORK/ref" "${args[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
resume() {  # NAME NP1 NP2 -- first layout's args -- second layout's args
  local name=$1 np1=$2 np2=$3
  shift 3
  local first=() second=() into=first
  for a in "$@"; do
    if [ "$a" = "--" ]; then into=second; continue; fi
    if [ $into = first ]; then first+=("$a"); else second+=("$a"); fi
  done
  local run="$WORK/$name"
  echo "== $name: $np1 ranks, killed at step 12, resumed on $np2 ranks"
  set +e
  YUANLM_KILL_AT=12 timeout 60 mpirun -x YUANLM_KILL_AT -np "$np1" bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$run" "${args[@]}" "${first[@]}" >/dev/null 2>&1
  set -e
  train "$np2" "$run" "${args[@]}" "${second[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  grep "resumed from $run/ckpt/step_0000010: step 10, written by $np1 ranks" "$WORK/log"
  compare "$WORK/ref" "$run" 1e-5 1e-5
}
resume pipelines-to-dp 4 2 "${pipes4[@]}" --
resume pipelines-to-heterogeneous 4 3 "${pipes4[@]}" -- "${pipes3[@]}"
resume dp-to-pipeline 2 2 -- "${pipes2[@]}"
