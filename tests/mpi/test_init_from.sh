# train --init.from=DIR: a fresh run starts from a HuggingFace GPT-2 directory.
#   a GPT-2 written as transformers' save_pretrained lays it out (tools/make_hf_gpt2.py) is evaluated by yuanlm
#   with the loss tools/check_export.py's transformers-faithful PyTorch model computes on the same windows (1e-5),
#   and the run's own val_loss at step 0 is that loss;
#   the same weights in the hub's original layout (no "transformer." prefix, mask buffers, lm_head written out)
#   give the same loss under tensor and pipeline parallelism and at ZeRO 3;
#   export, then --init.from, then eval gives the loss of the checkpoint exported;
#   a smaller vocabulary leaves the deck's extra rows of wte zero;
#   a resumed run does not read the directory again (it may be gone);
#   a directory that is not this deck's model is refused in one line naming config.json and the key, or
#   model.safetensors and the tensor, with a non-zero exit.
# The runs take one step at lr 1e-30: the step's update is below fp32's resolution of every weight, so the
# checkpoint holds the directory's weights and `yuanlm eval` reads them back.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
one=(--train.steps=1 --train.global_batch=4 --train.micro_batch=2 --train.eval_batches=4 --optim.lr=1e-30
     --optim.min_lr=0 --optim.warmup_steps=0 "--data.val=$WORK/corpus/*.h5")
M="$WORK/models"
hf() { $PY tools/make_hf_gpt2.py "$M/$1" --n-layer 2 --n-head 2 --n-embd 32 "${@:2}"; }
# run_eval NAME [train overrides...]: trains run NAME one step, evaluates its checkpoint into NAME.eval, on the
# same 16 windows whatever the run's layout (the trainer's own val set has 4 micro-batches per pipeline)
run_eval() {
  local name=$1
  shift
  train 2 "$WORK/$name" "${one[@]}" "$@" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
  grep -q "init.from .*: the weights of a HuggingFace GPT-2" "$WORK/$name.log" || { cat "$WORK/$name.log"; exit 1; }
  mpirun -np 2 bin/yuanlm eval --checkpoint "$WORK/$name" --batches 4 --micro-batch 2 --json >"$WORK/$name.eval"
}
# same_loss A B TOL: two val_loss values (numbers or eval --json outputs) within a relative TOL
same_loss() {
  $PY - "$@" <<'PYEOF'
import json, sys
val = lambda s: json.loads(open(s).read().splitlines()[-1])["val_loss"] if s.endswith(".eval") else float(s)
a, b, tol = val(sys.argv[1]), val(sys.argv[2]), float(sys.argv[3])
rel = abs(a - b) / abs(b)
print(f"val_loss {a!r} vs {b!r}: relative difference {rel:.2e} (tolerance {tol:g})")
sys.exit(0 if rel <= tol else 1)
PYEOF
}
# first_val METRICS: the first val_loss of a run's metrics.jsonl (step 0's)
first_val() {
  $PY -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][0]["val_loss"])' "$1"
}

echo "== transformers' layout against the PyTorch GPT-2"
hf pretrained --vocab 64 --positions 24 --seed 3
run_eval pretrained --init.from="$M/pretrained"
$PY tools/check_export.py "$M/pretrained" --eval "$WORK/pretrained.eval" --tol 1e-5
same_loss "$(first_val "$WORK/pretrained/metrics.jsonl")" "$WORK/pretrained.eval" 1e-6

echo "== the hub's layout, under other layouts"
hf hub --vocab 64 --positions 24 --seed 3 --layout hub
run_eval hub_dp --init.from="$M/hub"
same_loss "$WORK/hub_dp.eval" "$WORK/pretrained.eval" 1e-6
run_eval hub_tp --init.from="$M/hub" --parallel.tp_size=2
same_loss "$WORK/hub_tp.eval" "$WORK/pretrained.eval" 1e-6
run_eval hub_zero3 --init.from="$M/hub" --optim.zero=3
same_loss "$WORK/hub_zero3.eval" "$WORK/pretrained.eval" 1e-6
run_eval hub_pp --init.from="$M/hub" "--parallel.template=two: wte, wpe, h.0 | h.1, ln_f" \
  --parallel.pipelines=two --parallel.microbatches=two:2
same_loss "$WORK/hub_pp.eval" "$WORK/pretrained.eval" 1e-6

echo "== export, --init.from, eval"
train 2 "$WORK/trained" --train.steps=6 --train.global_batch=4 --train.micro_batch=2 --train.eval_batches=4 \
  "--data.val=$WORK/corpus/*.h5" >"$WORK/trained.log" 2>&1 || { cat "$WORK/trained.log"; exit 1; }
mpirun -np 2 bin/yuanlm eval --checkpoint "$WORK/trained" --batches 4 --micro-batch 2 --json >"$WORK/trained.eval"
bin/yuanlm export --checkpoint "$WORK/trained" --out "$M/exported"
run_eval again --init.from="$M/exported"
same_loss "$WORK/again.eval" "$WORK/trained.eval" 1e-6

echo "== a smaller vocabulary: the deck's extra rows of wte stay zero"
hf small --vocab 60 --positions 16 --seed 4
run_eval small --init.from="$M/small"
bin/yuanlm export --checkpoint "$WORK/small" --out "$M/small_out"
$PY - "$M/small_out/model.safetensors" <<'PYEOF'
import sys
sys.path.insert(0, "tools")
import numpy as np
from safetensors_f32 import read_f32
wte = read_f32(sys.argv[1])[0]["transformer.wte.weight"]
pad = float(np.abs(wte[60:]).max())
print(f"wte rows 60-63: largest |value| {pad:.1e}")
assert pad < 1e-20 and np.abs(wte[:60]).min() >= 0 and np.abs(wte[:60]).max() > 1e-3
PYEOF

echo "== a resumed run does not read the directory again"
mv "$M/small" "$M/gone"
train 2 "$WORK/small" "${one[@]}" --train.steps=2 --init.from="$M/small" >"$WORK/resume.log" 2>&1 ||
  { cat "$WORK/resume.log"; exit 1; }
grep -q "resumed from" "$WORK/resume.log"
! grep -q "init.from" "$WORK/resume.log"

echo "== refusals"
# refused_run NAME LINE: a run from model NAME fails with LINE, once, and writes no checkpoint
refused_run() {
  local name=$1 line=$2
  if train 2 "$WORK/r_$name" "${one[@]}" --init.from="$M/$name" >"$WORK/r_$name.log" 2>&1; then
    cat "$WORK/r_$name.log"; echo "FAIL: $name was accepted"; exit 1
  fi
  grep -F -- "$line" "$WORK/r_$name.log" || { cat "$WORK/r_$name.log"; echo "FAIL: no line '$line'"; exit 1; }
  [ "$(grep -cF -- "$line" "$WORK/r_$name.log")" = 1 ] ||
    { cat "$WORK/r_$name.log"; echo "FAIL: not one line"; exit 1; }
  [ ! -e "$WORK/r_$name/ckpt/latest" ]
}
# refused NAME LINE [make_hf_gpt2 options...]: the same for a model made with those options
refused() {
  hf "$1" "${@:3}"
  refused_run "$1" "$2"
}
refused wide "init.from $M/wide/config.json: \"n_embd\" is 48, the deck's model.n_embd 32" \
  --vocab 64 --positions 24 --n-embd 48
refused short "init.from $M/short/config.json: \"n_positions\" is 8, fewer than the deck's model.seq_len 16" \
  --vocab 64 --positions 8
refused big "init.from $M/big/config.json: \"vocab_size\" is 80, more than the deck's model.vocab_size 64" \
  --vocab 80 --positions 24
refused untied "init.from $M/untied/model.safetensors: lm_head.weight differs from wte.weight" \
  --vocab 64 --positions 24 --untied
hf headless --vocab 64 --positions 24
$PY - "$M/headless/model.safetensors" <<'PYEOF'
import sys
sys.path.insert(0, "tools")
from safetensors_f32 import read_f32, write_safetensors
t, meta = read_f32(sys.argv[1])
del t["transformer.h.1.mlp.c_fc.bias"]
write_safetensors(sys.argv[1], t, meta)
PYEOF
refused_run headless "init.from $M/headless/model.safetensors: no tensor transformer.h.1.mlp.c_fc.bias"
echo "PASS"
