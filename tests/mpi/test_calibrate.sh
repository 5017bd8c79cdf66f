#!/usr/bin/env bash
# `yuanlm plan --calibrate --out FILE`: on 2 ranks it writes a machine file that `plan --machine` reads back, every
# number measured (the link inside the node by ping-pong; the one across nodes, with one node, said not to be);
# alone, one rank measures the node and says the links are not measured; an --out that cannot be written is named
# before anything is measured, on every rank, with a non-zero exit.
source "$(dirname "$0")/lib.sh"
predict=(bin/yuanlm plan "${TINY[@]}" --data.train=x.h5 --world 2 --predict --json --machine)

# expect_in FILE PATTERN: grep -E, else show the file and fail.
expect_in() {
  grep -Eq "$2" "$1" || { echo "no '$2' in $1:"; cat "$1"; exit 1; }
}

echo "== 2 ranks on one node"
mpirun -np 2 bin/yuanlm plan --calibrate --out "$WORK/m.ini" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect_in "$WORK/log" "calibrate: wrote $WORK/m.ini"
"${predict[@]}" "$WORK/m.ini" >"$WORK/p.json" 2>&1 || { cat "$WORK/p.json"; exit 1; }
expect_in "$WORK/p.json" '"step_s":[0-9.e-]+'
for key in peak_flops gemm_half_flops mem_bw attention_flops gelu_rate softmax_rate; do
  expect_in "$WORK/m.ini" "^$key +=.*# measured: .*20[0-9-]+.*host "
done
expect_in "$WORK/m.ini" "^gemm_efficiency += 1  # measured"
expect_in "$WORK/m.ini" "^nodes_per_host += 1  # measured: nodes whose ranks read one kernel boot id"
expect_in "$WORK/m.ini" "^\[link.intra\]"
expect_in "$WORK/m.ini" "^bandwidth += [0-9.e+]+  # measured: MPI ping-pong, 4 MiB each way, ranks 0 and 1 on "
expect_in "$WORK/m.ini" "^latency_s += [0-9.e+-]+  # source: not measured \(one node\)"

echo "== 1 rank"
bin/yuanlm plan --calibrate --out "$WORK/one.ini" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
expect_in "$WORK/log" "warning: calibrate: no node had two ranks"
"${predict[@]}" "$WORK/one.ini" >"$WORK/p.json" 2>&1 || { cat "$WORK/p.json"; exit 1; }
expect_in "$WORK/one.ini" "^devices_per_node += 1  # measured"

echo "== an --out that cannot be written"
for out in "$WORK/no/such/dir/m.ini" "$WORK"; do
  if mpirun -np 2 bin/yuanlm plan --calibrate --out "$out" >"$WORK/log" 2>&1; then
    echo "calibrate wrote to '$out'"
    cat "$WORK/log"
    exit 1
  fi
  expect_in "$WORK/log" "^error: \[rank 0@[^]]*\] plan --calibrate: cannot write --out $out: "
  [ "$(grep -c '^error:' "$WORK/log")" = 1 ] || { echo "not one error line:"; cat "$WORK/log"; exit 1; }
  ! grep -q calibrating "$WORK/log" || { echo "measured before refusing '$out'"; cat "$WORK/log"; exit 1; }
done
echo "== --out without --calibrate"
if bin/yuanlm plan "${TINY[@]}" --out "$WORK/m2.ini" >"$WORK/log" 2>&1; then
  echo "--out without --calibrate taken"
  exit 1
fi
expect_in "$WORK/log" "^error: .*plan: --out names the machine file that --calibrate writes; add --calibrate"
echo "== a rank stopped in each part of the measurement: the job ends at the deadline, naming the wait"
cleanup() {  # a job that does not end by itself: take down what this test started
  local p
  for p in $(procs bin/yuanlm); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
# Rank 1 stops in every part; rank 0 in the links too, where it is the one sending.
for stop in 1:gemms "1:memory-bound ops" 1:adamw 1:loops 1:figures 1:links 0:links; do
  start=$(date +%s)
  set +e
  YUANLM_CALIBRATE_STOP=$stop timeout 120 mpirun -np 2 -x YUANLM_CALIBRATE_STOP bin/yuanlm plan --calibrate \
    --dist.timeout_s=3 --out "$WORK/stopped.ini" >"$WORK/log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  echo "stopped rank ${stop%%:*} in '${stop#*:}': exit $rc after $took s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$WORK/log"; echo "the job did not end by itself"; exit 1; }
  expect_in "$WORK/log" "calibrate: ${stop#*:}"
  [ "$(grep -c '^error:' "$WORK/log")" -eq 1 ] || { cat "$WORK/log"; echo "not one error line"; exit 1; }
  expect_in "$WORK/log" "^error: \[rank $((1 - ${stop%%:*}))@[^]]+\] no progress for 3 s: waiting in [a-z -]+ on group world.*dist.timeout_s 3"
  sleep 1
  [ -z "$(procs bin/yuanlm)" ] || { echo "ranks left behind: $(procs bin/yuanlm)"; exit 1; }
  [ ! -e "$WORK/stopped.ini" ] || { echo "a machine file was written"; exit 1; }
done
echo "test_calibrate: OK"
