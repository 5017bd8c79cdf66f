# `yuanlm plan` predicts what a rank holds; a real job of the same deck measures it. For each layout, the plan's
# rank_bytes (first stage) against the job's peak resident memory minus its resident memory before the model
# (MPI, libraries, runtime), both on rank 0, within 10%. The layouts move memory between the parts the plan adds:
# ZeRO 0/1/2/3 (replicated weights and grads, sharded moments, sharded grads, sharded weights with gather
# buffers), tensor parallelism, a 2-stage pipeline, one rank with recompute, ZeRO-3 on 4 ranks. The model is large
# enough (25M parameters) that MPI's and the allocator's own memory stay a few percent of it.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 20000 8192
deck=(--model.n_layer=8 --model.n_head=8 --model.n_embd=512 --model.seq_len=128 --model.vocab_size=8192
      --data.train="$WORK/corpus/*.h5" --train.micro_batch=2 --train.global_batch=4)
failed=0
check() {  # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  train "$np" "$WORK/$name" "${deck[@]}" --train.steps=2 "$@" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
  bin/yuanlm plan "${TINY[@]}" "${deck[@]}" --world "$np" --json "$@" | head -1 >"$WORK/$name.plan"
  $PY - "$name" "$WORK/$name/metrics.jsonl" "$WORK/$name.plan" <<'PYEOF' || failed=1
import json, sys
name, metrics, plan = sys.argv[1:4]
step = [r for r in map(json.loads, open(metrics)) if "loss" in r][-1]
planned = json.load(open(plan))["rank_bytes"]
measured = step["peak_host_bytes"] - step["base_host_bytes"]
ratio = measured / planned
print(f"{name:10s} plan {planned / 2**20:7.1f} MiB, measured {measured / 2**20:7.1f} MiB "
      f"(peak {step['peak_host_bytes'] / 2**20:.1f}, before the model {step['base_host_bytes'] / 2**20:.1f}), "
      f"measured/plan {ratio:.3f}")
if not 0.9 <= ratio <= 1.1:
    sys.exit(f"{name}: measured/plan {ratio:.3f} is outside [0.9, 1.1]")
PYEOF
}
check zero0 2 --optim.zero=0
check zero1 2 --optim.zero=1
check zero2 2 --optim.zero=2
check zero3 2 --optim.zero=3
check tp2 2 --parallel.tp_size=2
check pp2 2 "--parallel.template=two: wte, wpe, h.0-h.3 | h.4-h.7, ln_f" --parallel.pipelines=two \
  --parallel.microbatches=two:2
check recompute 1 --optim.zero=0 --train.recompute=true
check zero3x4 4 --optim.zero=3 --train.micro_batch=1
exit $failed
