#!/usr/bin/env bash
# Open MPI's rsh agent for the test cluster (plm_rsh_agent, see tests/cluster/lib.sh): called like ssh, as
# `rsh-agent.sh [ssh options] nodeK COMMAND...`, it runs COMMAND (joined into one shell line, as sshd would) on
# node K of the cluster named by YUANLM_CLUSTER, which mpirun passes down in its environment.
set -u
while [[ ${1:-} == -* ]]; do shift; done  # ssh options Open MPI may add (-x, -o ...): meaningless here
host=${1:?usage: rsh-agent.sh nodeK COMMAND...}
shift
[[ $host =~ ^node([0-9]+)$ ]] || { echo "rsh-agent.sh: '$host' is not a test cluster node (nodeK)" >&2; exit 255; }
source "$(dirname "$0")/lib.sh"
[ -e "/run/netns/$(cluster_netns "${BASH_REMATCH[1]}")" ] ||
  { echo "rsh-agent.sh: $host of cluster $YUANLM_CLUSTER is down (no namespace)" >&2; exit 255; }
# As ssh says "Connection to HOST closed by remote host." when the far side dies, the agent names the node whose
# command was killed: Open MPI, learning of a lost daemon from this exit before its connection closes, says only that
# it "was unable to reliably start one or more daemons".
on_node "${BASH_REMATCH[1]}" sh -c "$*"
rc=$?
((rc > 128)) && echo "rsh-agent.sh: $host: the command there was killed by signal $((rc - 128))" >&2
exit "$rc"
