# A global batch that does not divide by ranks x micro-batch is refused up front, naming both keys.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
set +e
timeout 60 mpirun -np 4 bin/yuanlm train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/run" \
  --train.global_batch=10 --train.micro_batch=2 >"$WORK/log" 2>&1
rc=$?
set -e
cat "$WORK/log"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failing exit, got $rc"; exit 1; }
grep -q "train.global_batch (10) must be divisible by" "$WORK/log"
[ "$(grep -c '^error:' "$WORK/log")" -eq 1 ] || { echo "expected exactly one error line"; exit 1; }
