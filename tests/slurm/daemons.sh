# shellcheck shell=bash
# The parts of a private test SLURM (slurm-wlm 22.05 + munge) that the one-node SLURM of tests/slurm/start.sh and
# the SLURM across the nodes of the test cluster (cluster_slurm_up in tests/cluster/lib.sh) share. Each function
# takes the cluster's directory D (config in D/etc, pid files in D/run, logs in D/log, state and spool under D) and, to start the
# daemons, a command ON called as `ON K CMD...` that runs CMD on node K: slurm_here for this host (one node), or
# on_node of tests/cluster/lib.sh; the controller and munged run on node 1. Failures print why on stdout and
# return 1.

slurm_here() {
  shift
  "$@"
}

# slurm_need: slurm-wlm and munge installed (apt-get when missing) and their programs found.
slurm_need() {
  local missing=() p b
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { echo "${missing[*]} missing and no apt-get"; return 1; }
    echo "slurm: installing ${missing[*]}" >&2
    { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >&2 ||
      { echo "apt-get install ${missing[*]} failed"; return 1; }
  fi
  for b in slurmctld slurmd sbatch srun scontrol sinfo munged; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || { echo "$b not found after installing slurm-wlm and munge"; return 1; }
  done
}

# slurm_hw: the hardware part of slurmd's node line (CPUs=... RealMemory=...): claiming more CPUs than slurmd
# counts would make the node INVAL.
slurm_hw() {
  local node
  node=$(slurmd -C 2>/dev/null | head -1)
  case "$node" in NodeName=*) echo "${node#NodeName=* }" ;; *) echo "slurmd -C printed no node line"; return 1 ;; esac
}

# slurm_conf D CTLD_HOST NODE_LINE...: writes D/etc/slurm.conf (fresh dirs under D) for a controller on CTLD_HOST
# and the given NodeName= lines, one partition "debug" over all of them. Every slurmd's files carry its node name
# (%n), so that several slurmd can share D.
slurm_conf() {
  local d=$1 ctld=$2 line
  shift 2
  rm -rf "$d"
  mkdir -p "$d"/{etc,run,munge,log,ctld,spool}
  {
    cat <<CONF
# Written by tests/slurm/daemons.sh: a private cluster for yuanlm's tests.
ClusterName=yuanlm-test
SlurmctldHost=$ctld
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged (munge_start). A requeued job waits cred_expire seconds before it may start again (default 120).
AuthInfo=cred_expire=10,socket=$d/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (default 60): a requeued job starts as soon as cred_expire has passed.
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
# Seconds between SIGTERM and SIGKILL at the time limit / scancel: time for a checkpoint.
KillWait=30
# Finished jobs stay visible to scontrol for 16 s (there is no accounting database). 16 also makes
# sbatch --wait poll every 8 s instead of backing off to 32 s (it waits min(4x, MinJobAge/2) between polls).
MinJobAge=16
MailProg=/bin/true
StateSaveLocation=$d/ctld
SlurmdSpoolDir=$d/spool/%n
# Node-local scratch: the PMIx plugin makes its per-step directories under TmpFS, and the test cluster's nodes
# share one /tmp (two nodes of a step would collide there).
TmpFS=$d/tmp/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
CONF
    for line in "$@"; do
      echo "$line State=UNKNOWN"
      line=${line#NodeName=}
      mkdir -p "$d/spool/${line%% *}" "$d/tmp/${line%% *}"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$d/etc/slurm.conf"
}

# munge_start D ON: our own munged on node 1, on the socket the config names (a site munged is left alone), with
# the machine's key; waits until it answers. Its socket is a path: every node reaches it, whatever its netns.
munge_start() {
  local d=$1 on=$2 sock=$1/munge/munge.socket
  [ -s /etc/munge/munge.key ] || { echo "/etc/munge/munge.key missing"; return 1; }
  chown munge:munge /etc/munge/munge.key "$d/munge"
  # munged runs as user munge and refuses a socket directory that others may write to.
  chmod 0755 "$d/munge"
  "$on" 1 runuser -u munge -- /usr/sbin/munged --socket="$sock" --pid-file="$d/munge/munged.pid" \
    --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed" 8>&- 9>&- 2>>"$d/log/munged.stderr" ||
    { echo "munged did not start"; return 1; }
  for _ in $(seq 50); do
    { munge -S "$sock" -n </dev/null | unmunge -S "$sock" >/dev/null; } 2>/dev/null && return 0
    sleep 0.1
  done
  echo "munged does not answer on $sock"
  return 1
}

# slurm_start D N ON: slurmctld (from an empty state) on node 1, a slurmd on each of nodes 1..N (each finds its
# NodeName line by its hostname), then waits up to 30 s until all N are idle. The daemons keep no lock fd of
# their caller (8, 9).
slurm_start() {
  local d=$1 n=$2 on=$3 conf=$1/etc/slurm.conf k state deadline
  "$on" 1 slurmctld -c -f "$conf" 8>&- 9>&- 2>>"$d/log/slurmctld.log" || { echo "slurmctld did not start"; return 1; }
  for k in $(seq "$n"); do
    "$on" "$k" slurmd -f "$conf" 8>&- 9>&- 2>>"$d/log/slurmd-start.log" || { echo "slurmd on node $k did not start"; return 1; }
  done
  deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ]; do
    state=$(SLURM_CONF=$conf "$on" 1 timeout 5 sinfo -h -N -o %T 2>/dev/null | sort | uniq -c | xargs)
    [ "$state" = "$n idle" ] && return 0
    sleep 0.2
  done
  echo "the nodes did not become idle within 30 s (states: ${state:-none})"
  return 1
}

# slurm_daemon_logs D: the last lines of every daemon's log, for a failure report.
slurm_daemon_logs() {
  local f
  for f in "$1"/log/*.log "$1"/munge/*.log; do
    [ -s "$f" ] || continue
    echo "--- $f (last 15 lines)"
    tail -15 "$f"
  done
}
