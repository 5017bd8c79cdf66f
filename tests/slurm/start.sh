#!/usr/bin/env bash
# Starts a private one-node SLURM (slurm-wlm 22.05 + munge) on this machine for the tests in tests/mpi/ that
# submit real batch jobs. As root: installs slurm-wlm and munge when missing (apt-get update first), writes
# $YUANLM_SLURM_DIR/etc/slurm.conf (default dir /tmp/yuanlm-slurm) for this host, starts munged (unless one is
# already answering), slurmctld and slurmd, and waits until the node is idle.
#
#   tests/slurm/start.sh            prints the line to eval: export SLURM_CONF=...
#   tests/slurm/stop.sh             stops exactly the daemons this script started (the PIDs in their pid files)
#
# The cluster is private: its own config (SLURM_CONF, so /etc/slurm is not touched), its own ports (16817/16818,
# so a site SLURM on 6817/6818 is not disturbed), state and spool under the dir, wiped at each start.
# Exit status: 0 up; 77 SLURM cannot run here (not root, packages cannot be installed, or a daemon does not
# come up), with a "SKIP:" line saying why and the daemon logs; anything else is a bug in this script.
set -uo pipefail
D=${YUANLM_SLURM_DIR:-/tmp/yuanlm-slurm}
started=0
skip() {
  echo "SKIP: SLURM cannot run here: $*" >&2
  if [ "$started" = 1 ]; then  # the daemons' own words, and whatever of them did start is stopped again
    for f in "$D"/log/*.log; do [ -s "$f" ] && { echo "--- $f (last lines)" >&2; tail -15 "$f" >&2; }; done
    "$(dirname "$0")/stop.sh" >/dev/null 2>&1
  fi
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not root (the daemons need root; run as root or use a site SLURM)"
# One private cluster per machine: the tests hold this lock (fd 9, tests/slurm/lib.sh) while they use it; a
# start.sh run by hand waits until no test is using the daemons it is about to replace.
source "$(dirname "$0")/lock.sh"
slurm_lock || skip "another user of $SLURM_LOCK held it for 15 minutes"

# Packages (Debian 12: slurm-wlm 22.05 pulls slurmctld, slurmd and slurm-client; munge for authentication).
missing=()
for p in slurm-wlm munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || skip "${missing[*]} missing and no apt-get"
  echo "slurm: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >&2 ||
    skip "apt-get install ${missing[*]} failed"
fi
for b in slurmctld slurmd sbatch srun scontrol sinfo munged; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || skip "$b not found after installing slurm-wlm and munge"
done

# A previous instance of ours that was never stopped (a killed test): stop it first.
"$(dirname "$0")/stop.sh" >/dev/null 2>&1 || true
rm -rf "$D"
mkdir -p "$D"/{etc,run,log,ctld,spool}
export SLURM_CONF=$D/etc/slurm.conf

# The node line as slurmd sees the hardware: more CPUs than it counts would make the node INVAL.
node=$(slurmd -C 2>/dev/null | head -1)
case "$node" in NodeName=*) ;; *) skip "slurmd -C printed no node line" ;; esac
host=$(echo "$node" | sed 's/^NodeName=\([^ ]*\).*/\1/')
cat >"$SLURM_CONF" <<CONF
# Written by tests/slurm/start.sh: a private one-node cluster for yuanlm's tests.
ClusterName=yuanlm-test
SlurmctldHost=$host
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire seconds before it may start again (default 120).
AuthInfo=cred_expire=10
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
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

started=1
# munge: reuse a munged that already answers (a site one); otherwise start ours and remember it.
if ! { munge -n </dev/null | unmunge >/dev/null; } 2>/dev/null; then
  [ -s /etc/munge/munge.key ] || skip "/etc/munge/munge.key missing"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key
  chmod 0755 /run/munge
  mkdir -p "$D/run/munge"
  chown munge:munge "$D/run/munge"  # munged writes its pid file as user munge
  runuser -u munge -- /usr/sbin/munged --pid-file="$D/run/munge/munged.pid" 9>&- 2>"$D/log/munged.log" ||
    skip "munged did not start"
  for _ in $(seq 50); do { munge -n </dev/null | unmunge >/dev/null; } 2>/dev/null && break; sleep 0.1; done
  { munge -n </dev/null | unmunge >/dev/null; } 2>/dev/null || skip "munged does not answer"
fi

# -c: start from an empty state (no jobs recovered). fd 9 is closed: a caller's lock must not outlive it.
slurmctld -c -f "$SLURM_CONF" 9>&- 2>>"$D/log/slurmctld.log" || skip "slurmctld did not start"
slurmd -f "$SLURM_CONF" 9>&- 2>>"$D/log/slurmd.log" || skip "slurmd did not start"
state=
deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ]; do
  state=$(timeout 5 sinfo -h -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || skip "the node did not become idle within 30 s (state: ${state:-none})"
echo "slurm: node $host idle ($(echo "$node" | grep -o 'CPUs=[0-9]*')), SLURM_CONF=$SLURM_CONF" >&2
echo "export SLURM_CONF=$SLURM_CONF"
