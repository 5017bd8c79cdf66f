# shellcheck shell=bash
# Sourced by tests/slurm/{start,stop,lib}.sh: slurm_lock takes the machine-wide lock of the private test SLURM
# on fd 9, waiting up to 15 minutes. A process that already holds it (fd 9 inherited from a test that took it)
# gets it at once: flock locks belong to the open file, which parent and child share.
SLURM_LOCK=/run/lock/yuanlm-slurm-test.lock
[ -d /run/lock ] && [ -w /run/lock ] || SLURM_LOCK=/tmp/yuanlm-slurm-test.lock
slurm_lock() {
  if [ "$(readlink "/proc/$$/fd/9" 2>/dev/null)" != "$SLURM_LOCK" ]; then
    exec 9>>"$SLURM_LOCK"
  fi
  flock -w 900 9
}
