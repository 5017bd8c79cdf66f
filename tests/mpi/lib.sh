# Shared by the end-to-end tests: a scratch dir, a random-token corpus, a tiny deck, and mpirun as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
WORK=$(mktemp -d /tmp/yuanlm-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PY=${PY:-/usr/bin/python3}  # Debian's, with h5py and numpy; GPU machines without it set PY (env/device-kit.sh)

# make_corpus DIR NSHARDS TOKENS_PER_SHARD VOCAB: random tokens (seeded), written with h5py.
make_corpus() {
  $PY - "$@" <<'PYEOF'
import sys, os, h5py, numpy as np
d, n, length, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(7)
for i in range(n):
    # a learnable stream: each token mostly follows from the previous one
    t = np.empty(length, dtype=np.uint16)
    t[0] = 1
    for j in range(1, length):
        t[j] = (t[j-1] * 5 + 3) % vocab if rng.random() < 0.8 else rng.integers(vocab)
    with h5py.File(f"{d}/shard_{i:03d}.h5", "w") as f:
        f.create_dataset("tokens", data=t, chunks=(min(length, 65536),))
        f.attrs["format_version"] = 1
        f.attrs["vocab_size"] = vocab
        f.attrs["eot_id"] = 0
        f.attrs["tokenizer"] = "synthetic:none"
PYEOF
}

# The tiny model every end-to-end test trains; more --key=value pairs override. eps 1e-5 rather than 1e-8:
# some gradients are exactly zero in exact arithmetic (e.g. the key bias: softmax ignores a constant shift) and
# float rounding leaves noise of ~1e-9 there, which AdamW with eps 1e-8 would turn into lr-sized steps of
# random sign; runs that sum in different orders would then differ by design, not by a bug.
TINY=(--optim.eps=1e-5 --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.seq_len=16 --model.vocab_size=64
      --train.device=cpu --train.seed=5 --train.log_every=5 --optim.lr=3e-3 --optim.warmup_steps=2
      --optim.min_lr=3e-4 --optim.grad_clip=1.0)

# local_job DIR RUNDIR: the directory in ckpt.local_dir DIR that holds run.dir RUNDIR's node-memory checkpoints
# (train/local_store.h: resolve_local_dir).
local_job() { echo "$1/yuanlm-$(printf %s "$(realpath -ms "$2")" | sha256sum | cut -c1-16)"; }

# procs PROGRAM: the pids of this test's processes running PROGRAM (their command lines name $WORK).
procs() { pgrep -f "^([^ ]*/)?$1 .*$WORK/" || true; }

# launch NP CMD...: CMD on NP ranks; tests/cluster/lib.sh redefines it to spread the ranks over its nodes.
launch() {
  local np=$1
  shift
  mpirun -np "$np" "$@"
}

# train NP RUNDIR [overrides...]
train() {
  local np=$1 dir=$2
  shift 2
  launch "$np" bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$dir" "$@"
}

# compare A B TOL_LOSS TOL_PARAM: per-step losses and final weights of two runs agree.
compare() {
  $PY tests/mpi/compare_runs.py "$@"
}

# Equivalence against one rank: reference writes $WORK/ref, 10 steps of global batch 8 (micro-batch 2) on 1 rank;
# against_ref NP DESCRIPTION ARGS... trains the same steps on NP ranks with ARGS into $WORK/runN and holds its losses
# and weights to the reference's within 1e-5. With MUST_LOG set, the run's log must contain it.
equiv=(--train.steps=10 --train.global_batch=8 --train.micro_batch=2)
reference() {
  train 1 "$WORK/ref" "${equiv[@]}" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
}
runs=0
against_ref() {
  local np=$1 what=$2
  shift 2
  runs=$((runs + 1))
  echo "== $what on $np ranks: $*"
  train "$np" "$WORK/run$runs" "${equiv[@]}" "$@" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
  if [ -n "${MUST_LOG:-}" ] && ! grep -q "$MUST_LOG" "$WORK/log"; then
    echo "no '$MUST_LOG' in the log"
    cat "$WORK/log"
    exit 1
  fi
  compare "$WORK/ref" "$WORK/run$runs" 1e-5 1e-5
}

# The layouts tools/comm_volume.py states the communication of, on 2 ranks: comm_layouts DIR G B ARGS... trains
# each with global batch G, micro-batch B and ARGS into DIR/NAME.
comm_layouts() {
  local dir=$1 g=$2 b=$3
  shift 3
  local -A layouts=([zero0]=--optim.zero=0 [zero1]=--optim.zero=1 [zero2]=--optim.zero=2 [zero3]=--optim.zero=3
                    [tp2]=--parallel.tp_size=2)
  for name in zero0 zero1 zero2 zero3 tp2 pp2; do
    local layout=("${layouts[$name]:-}")
    [ "$name" = pp2 ] && layout=("--parallel.template=two: auto:2" --parallel.pipelines=two
                                 --parallel.microbatches=two:$((g / b)))
    train 2 "$dir/$name" --train.global_batch="$g" --train.micro_batch="$b" "$@" "${layout[@]}" >"$dir/log" 2>&1 ||
      { cat "$dir/log"; exit 1; }
  done
}
