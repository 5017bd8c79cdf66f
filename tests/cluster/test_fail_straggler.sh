# shellcheck shell=bash
# Stragglers, one rank per node of 2, data parallel:
# - a slow node: node 2's rank held to a tenth of a core (a cgroup v1 cpu quota). The step line names it as the
#   slowest rank with what it costs the step (`| slowest rank 1@node2 +N ms`, shown past a quarter of the step),
#   and metrics.jsonl has slowest_rank 1 for most steps from then on.
# - a slow link: node 2's link held to 10 Mbit/s each way (tc tbf on both ends of its veth pair). No rank's own
#   work is late, so no rank is named; every rank waits for the transfers, and the step line says so
#   (`| all ranks waiting N%`, shown past three quarters of the step) with metrics.jsonl's all_wait_s.
# Exit 77 where namespaces cannot be made, or neither tc's tbf nor a cpu cgroup can (each case needs its own).
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cpu=/sys/fs/cgroup/cpu
cgroup_why=
[ -w "$cpu/cgroup.procs" ] && [ -e "$cpu/cpu.cfs_quota_us" ] || cgroup_why="no cgroup v1 cpu controller at $cpu"
cluster_up 2
tbf_why=
tc qdisc add dev "$(cluster_veth 1)" root tbf rate 10mbit burst 32kbit latency 400ms 2>/dev/null &&
  tc qdisc del dev "$(cluster_veth 1)" root || tbf_why="tc cannot add a tbf qdisc (tc qdisc add ... tbf)"
[ -z "$cgroup_why" ] || [ -z "$tbf_why" ] || { echo "SKIP: $tbf_why; $cgroup_why"; exit 77; }
make_corpus "$WORK/corpus" 2 4000 64
group=$cpu/yuanlm-straggler-$$
# cluster_exit takes the test's status from $?: handed on past the cgroup's removal (whose own status it was).
trap 'rc=$?; set +e; for p in $(cat "$group/cgroup.procs" 2>/dev/null); do echo "$p" >"$cpu/cgroup.procs"; done
      rmdir "$group" 2>/dev/null; (exit "$rc"); cluster_exit' EXIT
args=(--model.n_embd=64 --train.global_batch=16 --train.micro_batch=8)

# wait_steps NAME N: N more steps logged in $WORK/NAME/metrics.jsonl (up to 30 s).
wait_steps() {
  local n
  n=$(grep -c '"loss"' "$WORK/$1/metrics.jsonl")
  for _ in $(seq 300); do [ "$(grep -c '"loss"' "$WORK/$1/metrics.jsonl")" -ge $((n + $2)) ] && break; sleep 0.1; done
}

if [ -n "$cgroup_why" ]; then echo "(no slow node case: $cgroup_why)"; else
  echo "== node 2's rank held to a tenth of a core"
  mkdir "$group"
  CLUSTER_RANKS_PER_NODE=1 fault_start slow 2 "${args[@]}"
  before=$(wc -l <"$WORK/slow.log")
  echo 100000 >"$group/cpu.cfs_period_us"
  echo 10000 >"$group/cpu.cfs_quota_us"
  for p in $(rank_pids 2); do for t in /proc/"$p"/task/*; do echo "${t##*/}" >"$group/tasks"; done; done
  for _ in $(seq 300); do tail -n +"$before" "$WORK/slow.log" | grep -q "slowest rank 1@node2" && break; sleep 0.1; done
  wait_steps slow 20  # twenty more steps under the quota, for the metrics
  tail -n +"$before" "$WORK/slow.log" | grep -E "^step .* \| slowest rank 1@node2 \+[0-9]+ ms" | head -2 ||
    { cat "$WORK/slow.log"; echo "no step line names node 2's rank as the slowest"; exit 1; }
  $PY - "$WORK/slow/metrics.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
# From the first step that names it, what rank 1 costs the steps it is slowest in, summed, dwarfs what the other
# rank "costs" when it is: the quota also stops rank 1 while it is inside MPI, where that time counts as waiting,
# so in some steps its lead hides; the noise of the other rank's lead is a few ms.
first = next(i for i, l in enumerate(lines) if l["slowest_rank"] == 1 and l["straggler_s"] > 0.25 * l["step_s"])
after = lines[first:]
slow = [l for l in after if l["slowest_rank"] == 1]
cost = {r: sum(l["straggler_s"] for l in after if l["slowest_rank"] == r) for r in (0, 1)}
print(f"{len(slow)} of {len(after)} steps with rank 1 slowest, costing {cost[1] * 1000:.0f} ms in all "
      f"(rank 0 slowest: {cost[0] * 1000:.0f} ms)")
assert cost[1] > 4 * cost[0], f"rank 1 costs {cost[1]:.3f} s, rank 0 {cost[0]:.3f} s"
PYEOF
  kill "$FAULT_JOB" 2>/dev/null || true
  wait "$FAULT_JOB" 2>/dev/null || true
  # Nothing of this job may compete for the cores with the next case's ranks.
  for _ in $(seq 100); do [ -z "$(job_pids)" ] && break; sleep 0.1; done
fi

if [ -n "$tbf_why" ]; then echo "(no slow link case: $tbf_why)"; else
  echo "== node 2's link held to 10 Mbit/s"
  CLUSTER_RANKS_PER_NODE=1 fault_start link 2 "${args[@]}"
  first=$(grep -c '"loss"' "$WORK/link/metrics.jsonl")
  before=$(wc -l <"$WORK/link.log")
  tc qdisc add dev "$(cluster_veth 2)" root tbf rate 10mbit burst 32kbit latency 400ms
  nsenter --net="/run/netns/$(cluster_netns 2)" tc qdisc add dev eth0 root tbf rate 10mbit burst 32kbit latency 400ms
  wait_steps link 8
  tail -n +"$before" "$WORK/link.log" | grep -E "^step .* ms/step \| all ranks waiting [0-9]+% \|" | head -2 ||
    { cat "$WORK/link.log"; echo "link: no step line says that every rank waits"; exit 1; }
  $PY - "$WORK/link/metrics.jsonl" "$first" <<'PYEOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first = int(sys.argv[2])
fast = statistics.median(l["step_s"] for l in lines[1:first])
# The steps from the first one the limit slowed (a step of more than twice the unlimited median).
start = next(i for i in range(first, len(lines)) if lines[i]["step_s"] > 2 * fast)
slow = lines[start:]
waiting = [l for l in slow if l["all_wait_s"] > 0.75 * l["step_s"]]
named = [l for l in slow if l["straggler_s"] > 0.25 * l["step_s"]]
assert len(waiting) * 4 >= len(slow) * 3, f"every rank waiting in only {len(waiting)} of {len(slow)} slow steps"
assert len(named) * 4 <= len(slow), f"a slowest rank named in {len(named)} of {len(slow)} steps of a slow link"
print(f"link: {fast * 1000:.0f} ms/step before, {statistics.median(l['step_s'] for l in slow) * 1000:.0f} ms after; "
      f"every rank waiting in {len(waiting)} of {len(slow)} steps, a slowest rank named in {len(named)}")
PYEOF
  kill "$FAULT_JOB" 2>/dev/null || true
fi

