# shellcheck shell=bash
# The CUDA backend under a stopped rank: bin/yuanlm_emu (the CUDA emulator, whose NCCL is MPI over TCP) trains with
# --train.device=cuda, ZeRO 2, 4 ranks on 2 nodes, and one rank of node 2 is stopped (SIGSTOP) mid-step. The ranks
# that wait for it in NCCL reach dist.nccl_timeout_s (the MPI deadline, dist.timeout_s, is set past it, so that the
# NCCL path is the one tested): within it + 30 s every rank on every node has ended, the exit is non-zero, and the
# one "error:" line names the NCCL operation and group that waited and the silent rank and its node
# (tests/cluster/fail_lib.sh). Exit 77 without bin/yuanlm_emu (make emu) or where namespaces cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
[ -x bin/yuanlm_emu ] || { echo "SKIP bin/yuanlm_emu is not built (make emu)"; exit 77; }
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64
FAULT_BIN=bin/yuanlm_emu

# stop_rank_3 NAME ARGS...: the job with ARGS, rank 3 (node 2's last) stopped, ended by the NCCL deadline.
stop_rank_3() {
  local name=$1
  shift
  fault_start "$name" 4 --train.device=cuda "$@" --dist.nccl_timeout_s="$TIMEOUT" --dist.timeout_s=$((TIMEOUT * 4))
  kill -STOP "$(rank_pids 2 | sort -n | tail -1)"
  fault_end "$name" $((TIMEOUT + 30))
  one_error "$name" "^error: \[rank 0@node1\] no progress for [0-9]+ s: waiting in (synchronize after )?nccl[A-Za-z ()/]+ \
on group .*longer than dist.nccl_timeout_s $TIMEOUT; world rank 3 on node2 does not answer a liveness ping within \
[0-9.]+ s: stopped, dead or cut off"
}

echo "== the CUDA backend (emulated), ZeRO 2, 4 ranks on 2 nodes: rank 3 stopped"
stop_rank_3 zero2 --optim.zero=2
echo "== the same with tp 2 inside each node, data parallel across: rank 3 stopped"
stop_rank_3 tp2 --parallel.tp_size=2
