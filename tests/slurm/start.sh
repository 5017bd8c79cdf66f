#!/usr/bin/env bash
# Starts a private one-node SLURM (slurm-wlm 22.05 + munge) on this machine for the tests in tests/mpi/ that
# submit real batch jobs. As root: installs slurm-wlm and munge when missing (apt-get update first), writes
# $YUANLM_SLURM_DIR/etc/slurm.conf (default dir /tmp/yuanlm-slurm) for this host, starts its own munged (on a
# socket under the dir), slurmctld and slurmd, and waits until the node is idle (tests/slurm/daemons.sh, shared
# with the SLURM across the nodes of the test cluster, cluster_slurm_up in tests/cluster/lib.sh).
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
    slurm_daemon_logs "$D" >&2
    "$(dirname "$0")/stop.sh" >/dev/null 2>&1
  fi
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not root (the daemons need root; run as root or use a site SLURM)"
# One private cluster per machine: the tests hold this lock (fd 9, tests/slurm/lib.sh) while they use it; a
# start.sh run by hand waits until no test is using the daemons it is about to replace.
source "$(dirname "$0")/lock.sh"
slurm_lock || skip "another user of $SLURM_LOCK held it for 15 minutes"

source "$(dirname "$0")/daemons.sh"
why=$(slurm_need) || skip "$why"

# A previous instance of ours that was never stopped (a killed test): stop it first.
"$(dirname "$0")/stop.sh" >/dev/null 2>&1 || true
host=$(hostname -s)
hw=$(slurm_hw) || skip "$hw"
slurm_conf "$D" "$host" "NodeName=$host $hw NodeAddr=127.0.0.1"
export SLURM_CONF=$D/etc/slurm.conf
started=1
why=$(munge_start "$D" slurm_here) || skip "$why"
why=$(slurm_start "$D" 1 slurm_here) || skip "$why"
echo "slurm: node $host idle ($(echo "$hw" | grep -o 'CPUs=[0-9]*')), SLURM_CONF=$SLURM_CONF" >&2
echo "export SLURM_CONF=$SLURM_CONF"
