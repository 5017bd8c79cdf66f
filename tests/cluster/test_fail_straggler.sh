# shellcheck shell=bash
# A slow node: node 2's rank held to a tenth of a core (a cgroup v1 cpu quota) while both ranks train data
# parallel, one per node. The step line names it as the slowest rank with what it costs the step
# (`| slowest rank 1@node2 +N ms`, shown past a quarter of the step), and metrics.jsonl has slowest_rank 1 and
# straggler_s for most steps from then on. Exit 77 where namespaces or a cpu cgroup cannot be made.
source "$(dirname "$0")/../mpi/lib.sh"
source tests/cluster/lib.sh
source tests/cluster/fail_lib.sh
cpu=/sys/fs/cgroup/cpu
[ -w "$cpu/cgroup.procs" ] && [ -e "$cpu/cpu.cfs_quota_us" ] || { echo "SKIP: no cgroup v1 cpu controller at $cpu"; exit 77; }
cluster_up 2
make_corpus "$WORK/corpus" 2 4000 64
group=$cpu/yuanlm-straggler-$$
mkdir "$group"
trap 'for p in $(cat "$group/cgroup.procs" 2>/dev/null); do echo "$p" >"$cpu/cgroup.procs"; done; rmdir "$group"; cluster_exit' EXIT

CLUSTER_RANKS_PER_NODE=1 fault_start slow 2 --model.n_embd=64 --train.global_batch=16 --train.micro_batch=8
before=$(wc -l <"$WORK/slow.log")
echo 100000 >"$group/cpu.cfs_period_us"
echo 10000 >"$group/cpu.cfs_quota_us"
for p in $(rank_pids 2); do for t in /proc/"$p"/task/*; do echo "${t##*/}" >"$group/tasks"; done; done
for _ in $(seq 300); do tail -n +"$before" "$WORK/slow.log" | grep -q "slowest rank 1@node2" && break; sleep 0.1; done
# Ten more steps under the quota, for the metrics.
n=$(grep -c '"loss"' "$WORK/slow/metrics.jsonl")
for _ in $(seq 300); do [ "$(grep -c '"loss"' "$WORK/slow/metrics.jsonl")" -ge $((n + 10)) ] && break; sleep 0.1; done
tail -n +"$before" "$WORK/slow.log" | grep -E "^step .* \| slowest rank 1@node2 \+[0-9]+ ms" | head -2 ||
  { cat "$WORK/slow.log"; echo "no step line names node 2's rank as the slowest"; exit 1; }
$PY - "$WORK/slow/metrics.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first = next(i for i, l in enumerate(lines) if l["slowest_rank"] == 1 and l["straggler_s"] > 0.25 * l["step_s"])
slow = [l for l in lines[first:] if l["slowest_rank"] == 1 and l["straggler_s"] > 0.25 * l["step_s"]]
assert len(slow) * 2 > len(lines[first:]), f"rank 1 slowest in only {len(slow)} of {len(lines[first:])} steps"
print(f"{len(slow)} steps with rank 1 slowest, costing up to {max(l['straggler_s'] for l in slow) * 1000:.0f} ms")
PYEOF
kill "$FAULT_JOB" 2>/dev/null || true
