# Memory is refused before it is allocated: a deck whose plan exceeds what its node has stops every rank within
# seconds with one line giving the plan's breakdown and what to try (not std::bad_alloc, not an OOM kill after a
# minute), and writes nothing. Real cases, read from this machine: a model (parameters and optimizer), a sequence
# length (activations) and a read-ahead (data) far beyond any node; then, through the YUANLM_NODE_MEMORY hook, a
# node too small for 4 ranks of the tiny model (the ranks of a node are summed), one just large enough to train
# them, and eval refused the same way. Last, `plan --world` out of range.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64

# refused NAME NP PATTERN ARGS...: training is refused on every rank (rc 1) in seconds, with PATTERN in the one
# error line, and leaves no run directory.
refused() {
  local name=$1 np=$2 pattern=$3
  shift 3
  local start=$SECONDS rc=0
  train "$np" "$WORK/$name" --train.steps=2 "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  local took=$((SECONDS - start)) errors
  errors=$(grep -c '^error: ' "$WORK/$name.log" || true)
  echo "$name: rc $rc in ${took}s: $(grep '^error: ' "$WORK/$name.log" || true)"
  if [ "$rc" != 1 ] || [ "$errors" != 1 ] || ! grep -q "^error: \[rank 0@.*\] memory: .*$pattern" "$WORK/$name.log" ||
     [ "$took" -gt 20 ] || [ -e "$WORK/$name" ]; then
    echo "$name: expected rc 1 within 20 s, one error line matching '$pattern' and no run directory"
    cat "$WORK/$name.log"
    exit 1
  fi
}

refused model 2 "the 2 ranks on node .* need .* GiB of host memory (params .*, grads .*, optimizer .*, \
activations .*).* available (\(MemAvailable\|cgroup\).*; try a higher optim.zero (now 1; .*) or more ranks" \
  --model.n_layer=96 --model.n_head=96 --model.n_embd=12288
refused seq_len 2 "activations [0-9]\{4,\}\.[0-9]*, buffers [0-9]\{3,\}.*try train.recompute=true, a smaller \
model.seq_len (now 262144) or" --model.seq_len=262144 --train.micro_batch=1 \
  --train.global_batch=2
refused prefetch 1 "data [0-9]\{3,\}\..*try a smaller data.prefetch (now 2000000000) or" --data.prefetch=2000000000

# The ranks of a node share it: 4 tiny ranks do not fit in 600 MiB (their margins alone are 1 GiB), but fit in 2 GiB.
YUANLM_NODE_MEMORY=600M refused hook 4 "the 4 ranks on node .* need 1\.0[0-9] GiB .*margin 1\.00.*it has 0\.59 GiB \
available (YUANLM_NODE_MEMORY); try more ranks over more nodes" --train.micro_batch=2
YUANLM_NODE_MEMORY=2G train 4 "$WORK/fits" --train.steps=2 --train.micro_batch=2 >"$WORK/fits.log" 2>&1 ||
  { cat "$WORK/fits.log"; exit 1; }
grep -q "^done" "$WORK/fits.log" || { cat "$WORK/fits.log"; exit 1; }

# eval's ranks build replicas of the model: checked the same way.
rc=0
YUANLM_NODE_MEMORY=300M mpirun -np 2 bin/yuanlm eval --checkpoint "$WORK/fits" --data "$WORK/corpus/*.h5" \
  --batches 1 >"$WORK/eval.log" 2>&1 || rc=$?
grep -q "^error: \[rank 0@.*\] memory: the 2 ranks on node .* need .* GiB of host memory .*try .*fewer ranks per node" \
  "$WORK/eval.log" &&
  [ "$rc" = 1 ] || { echo "eval: rc $rc"; cat "$WORK/eval.log"; exit 1; }

for world in 0 -1 2000000; do
  rc=0
  bin/yuanlm plan "${TINY[@]}" --data.train=x --world="$world" >"$WORK/plan.log" 2>&1 || rc=$?
  grep -q "^error: .*plan: --world $world must be a number of ranks from 1 to" "$WORK/plan.log" && [ "$rc" = 1 ] ||
    { echo "plan --world $world: rc $rc"; cat "$WORK/plan.log"; exit 1; }
done
echo "memory refused before it is allocated"
