# An exception on one rank ends the whole job within seconds, non-zero, with one line naming rank and host.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
start=$(date +%s)
set +e
YUANLM_FAIL_AT=1:3 timeout 60 mpirun -x YUANLM_FAIL_AT -np 2 bin/yuanlm train "${TINY[@]}" \
  --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/run" --train.steps=50 --train.global_batch=4 \
  --train.micro_batch=2 >"$WORK/log" 2>&1
rc=$?
set -e
cat "$WORK/log"
elapsed=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failing exit, got $rc"; exit 1; }
[ "$elapsed" -lt 30 ] || { echo "took ${elapsed}s"; exit 1; }
grep -E "^error: \[rank 1@[^]]+\] injected failure at step 3" "$WORK/log"
