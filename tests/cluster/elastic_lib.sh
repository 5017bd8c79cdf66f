# shellcheck shell=bash
# Shared by tests/cluster/test_elastic_*.sh (sourced after tests/mpi/lib.sh and tests/cluster/lib.sh, with the
# cluster up): jobs/train.sbatch run across the nodes, nodes killed under it at random steps, and the checks every
# recovery must pass.
#
#   CKPT                        the checkpoint options of every elastic run, in one place: the fast tier every step
#                               (--ckpt.local_every=1, a directory per node under $WORK/local: the nodes share one
#                               file system here, and kill_at_random removes a killed node's directory with it);
#                               INTERVAL: the most steps a failure may lose with them
#   elastic_start NAME ARGS...  (the nodes an earlier job lost replaced first) HOSTFILE=... bash jobs/train.sbatch on
#                               node1 over every node (CLUSTER_RANKS_PER_NODE slots each) through the cluster's rsh
#                               agent, the tiny model with ARGS into $WORK/NAME, output $WORK/NAME.log; ELASTIC_JOB:
#                               its PID
#   kill_at_random NAME N       waits until the newest launch (the relaunch after the previous kill, if any) has
#                               logged N to N+2 steps (at random), then kills a random node other than node1 (the
#                               launching one) that is still up; KILLED: the nodes killed so far
#   elastic_check NAME RELAUNCHES RANKS NODES  elastic_wait NAME: the job ends with exit 0 within 120 s; then
#                               elastic_verify NAME ...: after RELAUNCHES relaunches, the last on RANKS ranks over NODES
#                               nodes (jobs.tsv), its losses and weights equal $WORK/ref's (1e-5), each failure lost at
#                               most INTERVAL steps; prints the times from each kill to the first new step
CKPT=(--ckpt.local_every=1 "--ckpt.local_dir=$WORK/local/%h")
INTERVAL=1
KILLED=()
KILL_TIMES=()  # when each node was killed (epoch seconds)

elastic_start() {
  local name=$1 k hosts=$WORK/$1.hosts
  shift
  for k in "${KILLED[@]}"; do node_replace "$k"; done  # the previous job's
  : >"$hosts"
  for k in $(seq "$CLUSTER_NODES"); do echo "node$k slots=${CLUSTER_RANKS_PER_NODE:-2}" >>"$hosts"; done
  on_node 1 env HOSTFILE="$hosts" RUN_DIR="$WORK/$name" PROBE_TIMEOUT=5 OMPI_MCA_plm_rsh_agent="$CLUSTER_AGENT" \
    OMPI_MCA_btl=tcp,self,vader OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 \
    bash jobs/train.sbatch input/tiny.ini "${TINY[@]}" --data.train="$WORK/corpus/*.h5" --data.val= \
    --train.log_every=1 "${CKPT[@]}" "$@" >"$WORK/$name.log" 2>&1 &
  ELASTIC_JOB=$!
  KILLED=()
  KILL_TIMES=()
}

# steps_logged NAME: the step lines the newest launch of NAME has logged.
steps_logged() {
  awk '/relaunch [0-9]+ at once/ { n = 0 } /^step / { n++ } END { print n + 0 }' "$WORK/$1.log" 2>/dev/null
}

kill_at_random() {
  local name=$1 want=$(($2 + RANDOM % 3)) k up=() ready=0
  # 2 minutes, as elastic_wait: on a loaded machine the start-up of 8 ranks on 2 cores may take a minute.
  for _ in $(seq 2400); do
    # The launch the previous kill ended has been replaced, and has logged its steps.
    [ "$(grep -c "relaunch [0-9]* at once" "$WORK/$name.log")" -ge ${#KILLED[@]} ] &&
      [ "$(steps_logged "$name")" -ge "$want" ] && { ready=1; break; }
    kill -0 "$ELASTIC_JOB" 2>/dev/null || { cat "$WORK/$name.log"; echo "$name: the job ended before step $want"; exit 1; }
    sleep 0.05
  done
  [ "$ready" = 1 ] || { cat "$WORK/$name.log"; echo "$name: step $want of the current launch not logged in 120 s"; exit 1; }
  for k in $(seq 2 "$CLUSTER_NODES"); do [[ " ${KILLED[*]} " == *" $k "* ]] || up+=("$k"); done
  k=${up[RANDOM % ${#up[@]}]}
  echo "$name: node$k killed after $(steps_logged "$name") steps of the current launch"
  KILL_TIMES+=("$(date +%s.%N)")
  node_kill "$k"
  rm -rf "$WORK/local/node$k"  # its memory goes with it (the nodes share one file system here)
  KILLED+=("$k")
}

elastic_check() {
  elastic_wait "$1"
  elastic_verify "$@"
}

elastic_wait() {
  local name=$1 rc
  # 2 minutes: on a loaded machine a step of 8 ranks on 2 cores may take seconds.
  for _ in $(seq 1200); do kill -0 "$ELASTIC_JOB" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$ELASTIC_JOB" 2>/dev/null && { cat "$WORK/$name.log"; echo "$name: the job did not end in 120 s"; exit 1; }
  set +e
  wait "$ELASTIC_JOB"
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || { cat "$WORK/$name.log"; echo "$name: exit $rc"; exit 1; }
}

elastic_verify() {
  local name=$1 relaunches=$2 ranks=$3 nodes=$4 run=$WORK/$1
  grep -E "failure detected|killing srun|launcher failed|relaunch [0-9]+ at once|first new step|^replan|re-formed|dropped|lost:|^resume|^resumed" "$WORK/$name.log" | sed 's/^/  /'
  # jobs.tsv: one line per launch; the relaunches carry the recovery figures (columns 9-13).
  awk -F'\t' -v n=$((relaunches + 1)) -v ranks="$ranks" -v nodes="$nodes" -v lost="$INTERVAL" -v kills="${KILL_TIMES[*]}" '
    BEGIN { split(kills, killed, " ") }
    NR < n && $5 == 0 { bad = "a launch before the last exited 0" }
    NR > 1 && ($12 == "-" || $13 > lost) { bad = "relaunch " $9 ": first new step " $12 ", steps lost " $13 }
    NR > 1 { printf "  relaunch %d: node killed to failure detected %.1f s, to relaunch %.1f s, to the first new step " \
                    "%.1f s; %d step(s) lost\n", $9, $10 - killed[NR - 1], $11 - killed[NR - 1], $12 - killed[NR - 1], $13 }
    END { if (NR != n) bad = NR " launches, expected " n
          else if ($5 != 0 || $7 != ranks || $8 != nodes) bad = "the last launch: exit " $5 ", " $7 " ranks, " $8 " nodes"
          if (bad) { print "bad jobs.tsv: " bad; exit 1 } }' "$run/jobs.tsv" ||
    { cat "$run/jobs.tsv" "$WORK/$name.log"; exit 1; }
  compare "$WORK/ref" "$run" 1e-5 1e-5
}
