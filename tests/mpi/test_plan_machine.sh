# `yuanlm plan --machine`: the search over layouts prints the best with a command line that `yuanlm plan` (the
# trainer's parse and checks) accepts as it is, --predict of that layout gives the same prediction, and bad input
# (a machine file with an unknown key, a directory as the machine file, a deck no layout fits, --predict without a
# machine) is one error line that says where and what.
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
"${deck[@]}" --world 2 --predict >"$WORK/out" 2>&1 && fail "--predict without --machine was accepted"
grep -q "^error: .*--predict needs --machine FILE" "$WORK/out" ||
  fail "--predict alone: wrong error" "$WORK/out"
echo "plan --machine: search, overrides, predict and bad input: OK"
