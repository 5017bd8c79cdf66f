# shellcheck shell=bash
# Shared by tests/cluster/test_fail_*.sh (sourced after tests/mpi/lib.sh and tests/cluster/lib.sh, with the
# cluster up): a training across the nodes that a fault then hits, and the checks every fault must pass.
#
#   fault_start NAME NP ARGS...  starts NP ranks (CLUSTER_RANKS_PER_NODE per node) of $FAULT_BIN (default
#                                bin/yuanlm) training the tiny model for ever with --dist.timeout_s=$TIMEOUT into
#                                $WORK/NAME, log $WORK/NAME.log, and returns once 3 steps are logged; FAULT_JOB: the
#                                launcher's PID
#   rank_pids K                  the PIDs of node K's ranks
#   fault_end NAME LIMIT         after a fault: the job ends within LIMIT seconds with a non-zero exit, no
#                                process of it is left on any node (the watcher processes included)
#   one_error NAME REGEX         the log holds exactly one "error:" line, and it matches REGEX
TIMEOUT=${TIMEOUT:-5}
FAULT_BIN=${FAULT_BIN:-bin/yuanlm}

fault_start() {
  local name=$1 np=$2
  shift 2
  launch "$np" "$FAULT_BIN" train "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/$name" \
    --train.steps=100000 --train.global_batch=8 --train.micro_batch=2 --train.log_every=1 --ckpt.every=0 \
    --dist.timeout_s="$TIMEOUT" "$@" >"$WORK/$name.log" 2>&1 &
  FAULT_JOB=$!
  for _ in $(seq 300); do
    [ -f "$WORK/$name/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$WORK/$name/metrics.jsonl")" -ge 3 ] && return 0
    kill -0 "$FAULT_JOB" 2>/dev/null || break
    sleep 0.1
  done
  cat "$WORK/$name.log"
  echo "$name: the training did not start"
  exit 1
}

rank_pids() {
  local p
  for p in $(node_pids "$1"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$(basename "$FAULT_BIN")" ] && echo "$p"; done
  return 0
}

# The processes of the job on every node: those in the nodes' namespaces, and the watchers (sessions of their
# own, still in a node's namespace).
job_pids() {
  local k
  for k in $(seq "$CLUSTER_NODES"); do node_pids "$k"; done
}

fault_end() {
  local name=$1 limit=$2 start rc took
  start=$(date +%s.%N)
  # The launcher's exit does not mean the far side has ended: wait for the nodes to empty too, up to the limit.
  while { kill -0 "$FAULT_JOB" 2>/dev/null || [ -n "$(job_pids)" ]; } && $PY -c "import sys; sys.exit(float(sys.argv[2])
    - float(sys.argv[1]) >= float(sys.argv[3]))" "$start" "$(date +%s.%N)" "$limit"; do sleep 0.2; done
  kill -0 "$FAULT_JOB" 2>/dev/null && { tail -20 "$WORK/$name.log"; echo "$name: the job did not end in $limit s"; exit 1; }
  set +e
  wait "$FAULT_JOB"
  rc=$?
  set -e
  took=$($PY -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$start" "$(date +%s.%N)")
  echo "$name: exit $rc, every process gone after $took s"
  grep "^error:" "$WORK/$name.log" || true
  [ "$rc" -ne 0 ] || { tail -20 "$WORK/$name.log"; echo "$name: exit 0"; exit 1; }
  [ -z "$(job_pids)" ] || { ps -o pid,comm,args -p "$(job_pids | paste -sd,)" | cut -c1-150
                             echo "$name: processes left after $limit s"; exit 1; }
}

one_error() {
  local name=$1 regex=$2
  [ "$(grep -c '^error:' "$WORK/$name.log")" -eq 1 ] || { cat "$WORK/$name.log"; echo "$name: not one error line"; exit 1; }
  grep -Eq "$regex" "$WORK/$name.log" || { echo "$name: the line does not match $regex"; exit 1; }
}
