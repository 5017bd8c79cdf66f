# The kernel account (profile.kernels, backend/kernel_account.h) on the CUDA emulator: the tiny model for 4 steps
# with steps 2-3 accounted, then checked:
#   - the table on stdout, and run.dir/kernels.json with every field of its schema, `emulated` true and the times
#     said to be meaningless;
#   - the op families of a step (encoder, layernorm, matmul, attention, classifier, copies) in its phases
#     (forward, backward, optimizer, transfer), and nothing outside a scope (family "other");
#   - every matmul_forward's FLOPs 2 N C OC per call, from its shape string;
#   - the losses and gradient norms the same bits as a run without the key: the account only watches;
#   - refusals, one line and a non-zero exit: the cpu device, and windows that are not A:B within train.steps.
source "$(dirname "$0")/lib.sh"
[ -x bin/yuanlm_emu ] || { echo "SKIP: bin/yuanlm_emu is not built (make emu)"; exit 77; }
make_corpus "$WORK/corpus" 1 4000 64
run=(--train.device=cuda --train.steps=4 --train.global_batch=4 --train.micro_batch=2 --data.train="$WORK/corpus/*.h5")

echo "== steps 2-3 accounted, and the same run without the account"
bin/yuanlm_emu train "${TINY[@]}" "${run[@]}" --profile.kernels=2:3 --run.dir="$WORK/on" >"$WORK/on.log" 2>&1 ||
  { cat "$WORK/on.log"; exit 1; }
bin/yuanlm_emu train "${TINY[@]}" "${run[@]}" --run.dir="$WORK/off" >"$WORK/off.log" 2>&1 ||
  { cat "$WORK/off.log"; exit 1; }
grep -q "^kernel account, steps 2-3, times meaningless: emulated device" "$WORK/on.log" ||
  { cat "$WORK/on.log"; exit 1; }
grep -qE "^op +phase +shape +calls +time ms" "$WORK/on.log" || { cat "$WORK/on.log"; exit 1; }
grep -q "^unaccounted: " "$WORK/on.log" || { cat "$WORK/on.log"; exit 1; }
if grep -q "kernel account" "$WORK/off.log"; then echo "a run without profile.kernels printed an account"; exit 1; fi
[ ! -e "$WORK/off/kernels.json" ] || { echo "a run without profile.kernels wrote kernels.json"; exit 1; }

$PY - "$WORK/on/kernels.json" "$WORK/on/metrics.jsonl" "$WORK/off/metrics.jsonl" <<'PYEOF'
import json, re, sys
j = json.load(open(sys.argv[1]))
assert j["emulated"] is True and j["times"] == "meaningless: emulated device", j["times"]
assert j["steps"] == [2, 3], j["steps"]
for k in ("device", "step_time_s", "busy_s", "unaccounted_s", "unaccounted_share", "peak", "operations"):
    assert k in j, k
for k in ("flops", "bytes_per_s", "source"):
    assert k in j["peak"], k
assert j["peak"]["flops"] > 0 and j["peak"]["bytes_per_s"] > 0, j["peak"]
assert 0 <= j["unaccounted_share"] <= 1, j["unaccounted_share"]
op_fields = ("name", "family", "phase", "shape", "calls", "launches", "time_s", "flops", "ideal_bytes", "tflops",
             "gbps", "roofline_fraction", "bound", "kernels", "touched_bytes", "sector_efficiency")
kernel_fields = ("name", "launches", "time_s", "touched_bytes", "read_bytes", "written_bytes", "requests", "sectors",
                 "sector_efficiency", "shared_requests", "bank_conflicts", "occupancy", "registers", "findings")
ops = j["operations"]
for o in ops:
    for k in op_fields:
        assert k in o, (k, o["name"])
    assert o["kernels"] and o["launches"] == sum(k["launches"] for k in o["kernels"]), o
    assert o["bound"] in ("compute", "memory", "link"), o
    for k in o["kernels"]:
        for f in kernel_fields:
            assert f in k, (f, o["name"], k["name"])
families = {o["family"] for o in ops}
for f in ("encoder", "layernorm", "matmul", "attention", "classifier", "copy"):
    assert f in families, (f, sorted(families))
assert "other" not in families, [o["kernels"][0]["name"] for o in ops if o["family"] == "other"]
phases = {o["phase"] for o in ops}
for p in ("forward", "backward", "optimizer", "transfer"):
    assert p in phases, (p, sorted(phases))
assert any("exempt" in o for o in ops), "no op says why it moves more than its ideal bytes"
# Every GEMM of the forward: 2 N C OC FLOPs a call, from the shape the account printed.
mm = [o for o in ops if o["name"] == "matmul_forward"]
assert mm
for o in mm:
    N, C, OC = (int(v) for v in re.match(r"N=(\d+) C=(\d+) OC=(\d+)", o["shape"]).groups())
    assert o["flops"] == 2 * N * C * OC * o["calls"], (o["shape"], o["flops"], o["calls"])
# 4 steps, 2 micro-batches each: steps 2-3 ran each layer's matmuls 4 times.
qkv = [o for o in mm if o["shape"].startswith("N=32 C=32 OC=96")]
assert qkv and qkv[0]["calls"] == 4 * 2, qkv  # two layers
on = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
off = [json.loads(l) for l in open(sys.argv[3]) if '"loss"' in l]
assert len(on) == len(off) == 4
for a, b in zip(on, off):
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], (a, b)
print("kernels.json: %d operations, families %s" % (len(ops), " ".join(sorted(families))))
PYEOF

echo "== refusals"
# refuse WANT ARGS...: the run fails, and its one error line is WANT.
refuse() {
  local want=$1
  shift
  if bin/yuanlm_emu train "${TINY[@]}" --train.steps=4 --data.train="$WORK/corpus/*.h5" --run.dir="$WORK/refused" "$@" \
      >"$WORK/refused.log" 2>&1; then
    cat "$WORK/refused.log"; echo "ran with $*"; exit 1
  fi
  [ "$(grep -c '^error:' "$WORK/refused.log")" -eq 1 ] || { cat "$WORK/refused.log"; exit 1; }
  grep '^error:' "$WORK/refused.log" | grep -qF "$want" || { cat "$WORK/refused.log"; echo "wanted: $want"; exit 1; }
}
refuse "profile.kernels times GPU work with CUDA events: it needs train.device=cuda (got 'cpu')" \
  --train.device=cpu --profile.kernels=1:2
refuse "profile.kernels must be A:B with 1 <= A <= B (got '3:2')" --train.device=cuda --profile.kernels=3:2
refuse "profile.kernels must be A:B with 1 <= A <= B (got '2')" --train.device=cuda --profile.kernels=2
refuse "profile.kernels 3:5 ends after train.steps (4): the account would never be written" \
  --train.device=cuda --profile.kernels=3:5
echo "kernel account: OK"
