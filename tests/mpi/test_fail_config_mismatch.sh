# Ranks started with different configs (an MPMD launch here; on a cluster, a deck edited between nodes) stop
# at start with the differing rank named.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
args=("${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/run" --train.global_batch=4 --train.micro_batch=2)
set +e
timeout 60 mpirun -np 1 bin/yuanlm train "${args[@]}" : -np 1 bin/yuanlm train "${args[@]}" --optim.lr=1e-2 \
  >"$WORK/log" 2>&1
rc=$?
set -e
cat "$WORK/log"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failing exit, got $rc"; exit 1; }
grep -E "^error: .*rank 1" "$WORK/log"
