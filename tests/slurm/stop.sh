#!/usr/bin/env bash
# Stops the private SLURM that tests/slurm/start.sh started: cancels its jobs, then ends slurmd, slurmctld and
# its munged, each by the PID in its pid file under $YUANLM_SLURM_DIR/run, checking the PID still belongs to that
# daemon. Never by name; a site munged or SLURM is left alone.
set -uo pipefail
D=${YUANLM_SLURM_DIR:-/tmp/yuanlm-slurm}
[ -d "$D/run" ] || exit 0
source "$(dirname "$0")/lock.sh"
slurm_lock || { echo "stop.sh: $SLURM_LOCK held for 15 minutes by a test; not stopping its daemons" >&2; exit 1; }
export SLURM_CONF=$D/etc/slurm.conf
alive() {  # NAME PIDFILE: prints the PID when the file names a live process called NAME
  local pid
  pid=$(cat "$2" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}
if alive slurmctld "$D/run/slurmctld.pid" >/dev/null; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    scancel $jobs 2>/dev/null
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi
for f in "$D"/run/slurmd-*.pid "$D/run/slurmctld.pid" "$D/munge/munged.pid"; do
  name=$(basename "$f" .pid)
  pid=$(alive "${name%%-*}" "$f") || { rm -f "$f"; continue; }
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  rm -f "$f"
done
exit 0
