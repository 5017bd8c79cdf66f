# `yuanlm plan --machine`: the search over layouts prints the best with a command line that `yuanlm plan` (the
# trainer's parse and checks) accepts as it is, --predict of that layout gives the same prediction, on a GPU machine
# the optimizer's state placed on the GPUs or the host (Yuan-4.7B on 8 H100s: on the GPUs first), and bad input
# (a machine file with an unknown key, a directory as the machine file, a deck no layout fits, model.attention = cudnn
# on a machine without cuDNN's attention, --predict without a machine) is one error line that says where and what.
source "$(dirname "$0")/lib.sh"

fail() { echo "$1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }
deck=(bin/yuanlm plan input/tiny.ini --data.train=x)

"${deck[@]}" --machine input/machines/cpu.ini --nodes 2 --top 3 --json >"$WORK/top.json" 2>"$WORK/err" ||
  fail "plan --machine --nodes 2 failed" "$WORK/err"
[ "$(grep -c '"rank":[0-9]' "$WORK/top.json")" = 3 ] || fail "expected the best 3 layouts" "$WORK/top.json"
# The winner's overrides, applied to the deck, give a layout the trainer accepts on its world, predicted alike.
mapfile -t best < <($PY -c '
import json, sys
j = json.loads(open(sys.argv[1]).readline())
print(j["world"]); print(j["step_s"]); [print(o) for o in j["overrides"]]' "$WORK/top.json")
world=${best[0]} step=${best[1]}
"${deck[@]}" --world "$world" "${best[@]:2}" >"$WORK/layout" 2>&1 ||
  fail "the winner's overrides are refused" "$WORK/layout"
"${deck[@]}" --world "$world" --nodes 2 "${best[@]:2}" --machine input/machines/cpu.ini --predict --json \
  >"$WORK/predict.json" 2>&1 || fail "--predict of the winner failed" "$WORK/predict.json"
$PY -c 'import json, sys; p = json.load(open(sys.argv[1])); assert abs(p["step_s"] / float(sys.argv[2]) - 1) < 1e-9' \
  "$WORK/predict.json" "$step" || fail "--predict differs from the search's prediction of the same layout"

# On a GPU machine each layout, at every ZeRO stage, comes twice, the optimizer state on the GPUs (optim.offload =
# none) and on the host, each saying which in its layout, its overrides and its JSON. Yuan-4.7B on one node of 8
# H100s ranks the state on the GPUs first (12 bytes a parameter over 8 ranks fit at ZeRO 1, which ties with ZeRO 2
# and is enumerated first), and --predict of the winner's overrides, or of the deck's own optim.offload = auto, puts
# it there too, with the same step.
yuan=(bin/yuanlm plan input/yuan-4.7b.ini --machine input/machines/h100-sxm.ini)
"${yuan[@]}" --nodes 1 --ranks-per-node 8 --top 4 --json >"$WORK/h100.json" 2>"$WORK/err" ||
  fail "plan Yuan-4.7B on 8 H100 failed" "$WORK/err"
mapfile -t best < <($PY -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    assert r["offload"] in ("none", "host"), r
    assert "--optim.offload=" + r["offload"] in r["overrides"], r
    assert (r["device_optimizer_bytes"] > 0) == (r["offload"] == "none"), r
j = rows[0]
assert j["offload"] == "none" and "--optim.zero=1" in j["overrides"], j
print(j["step_s"]); [print(o) for o in j["overrides"]]' "$WORK/h100.json") ||
  fail "Yuan-4.7B on 8 H100: placements wrong, or not on the device first" "$WORK/h100.json"
step=${best[0]}
"${yuan[@]}" --world 8 --nodes 1 "${best[@]:1}" --predict --json >"$WORK/predict.json" 2>&1 ||
  fail "--predict of the H100 winner failed" "$WORK/predict.json"
"${yuan[@]}" --world 8 --nodes 1 --train.micro_batch=4 --optim.zero=1 --predict --json >"$WORK/auto.json" 2>&1 ||
  fail "--predict of the deck with optim.offload = auto failed" "$WORK/auto.json"
$PY -c '
import json, sys
for f in sys.argv[1:3]:
    p = json.load(open(f))
    assert p["offload"] == "none" and abs(p["step_s"] / float(sys.argv[3]) - 1) < 1e-9, (f, p)
    assert "--optim.offload=none" in p["overrides"], (f, p)' "$WORK/predict.json" "$WORK/auto.json" "$step" ||
  fail "--predict differs from the search's prediction of the H100 winner"
"${yuan[@]}" --nodes 1 --ranks-per-node 8 --top 1 >"$WORK/h100.txt" 2>&1 || fail "plan Yuan-4.7B (text) failed" "$WORK/h100.txt"
for line in '^1\. tp 1, .*, ZeRO 1, optimizer on the device$' \
            '^predicted step .* tokens/s \(1B tokens in [0-9.]* h\), MFU ' \
            "^memory: optimizer state on the device \(optim.offload = none\); fullest device [0-9.]* GiB \([0-9.]* GiB of it the optimizer state\), fullest node's host [0-9.]* GiB$" \
            '^run: mpirun -np 8 yuanlm train DECK .* --optim.zero=1 --optim.offload=none '; do
  grep -Eq "$line" "$WORK/h100.txt" || fail "plan Yuan-4.7B: no line matching $line" "$WORK/h100.txt"
done

sed 's/^mem_bw /mem_bandwith /' input/machines/cpu.ini >"$WORK/bad.ini"
"${deck[@]}" --machine "$WORK/bad.ini" --nodes 1 >"$WORK/out" 2>&1 && fail "a bad machine file was accepted"
grep -q "^error: .*bad.ini:13: key 'device.mem_bandwith': unknown key$" "$WORK/out" ||
  fail "bad key: wrong error" "$WORK/out"
# A directory read as a file would be an empty machine: every key missing.
"${deck[@]}" --machine input/machines --nodes 1 >"$WORK/out" 2>&1 && fail "a directory was accepted as a machine file"
[ "$(wc -l <"$WORK/out")" = 1 ] &&
  grep -q "^error: .*machine file input/machines is a directory, expected an INI file$" "$WORK/out" ||
  fail "a directory as --machine: wrong error" "$WORK/out"
"${deck[@]}" --model.n_embd=8192 --model.n_head=8 --machine input/machines/cpu.ini --nodes 1 >"$WORK/out" 2>&1 &&
  fail "a deck larger than the node was planned"
grep -q "^error: .*no layout of the deck fits 1 node x 2 ranks.*short of host memory: node 0's ranks need .*GiB short" \
  "$WORK/out" || fail "no fit: wrong error" "$WORK/out"
# model.attention = cudnn where the machine file gives cuDNN's attention no efficiency (sm_70: none runs there).
"${deck[@]}" --model.attention=cudnn --machine input/machines/v100.ini --nodes 1 >"$WORK/out" 2>&1 &&
  fail "model.attention = cudnn was planned on the V100"
[ "$(wc -l <"$WORK/out")" = 1 ] &&
  grep -q "^error: .*model.attention = cudnn, but input/machines/v100.ini gives no \[device\] cudnn_attention_efficiency" \
    "$WORK/out" || fail "model.attention = cudnn on the V100: wrong error" "$WORK/out"
"${deck[@]}" --world 2 --predict >"$WORK/out" 2>&1 && fail "--predict without --machine was accepted"
grep -q "^error: .*--predict needs --machine FILE" "$WORK/out" ||
  fail "--predict alone: wrong error" "$WORK/out"
echo "plan --machine: search, overrides, predict, the optimizer's placement and bad input: OK"
