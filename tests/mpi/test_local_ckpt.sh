# The fast checkpoint tier on one host: local checkpoints written every ckpt.local_every steps and rotated; a job
# SIGKILLed (mpirun and all) after step 7 resumes from node memory at step 6 on another number of ranks, says which
# tier, step and steps lost, and ends with the losses and weights of a run never interrupted (and a run that is
# never interrupted has exactly the losses and weights it would have without local checkpoints); a corrupted or
# truncated local file (CRC-32C in the manifest) is skipped for the generation before it; the filesystem
# checkpoints are hashed only when node memory holds nothing newer; an unwritable ckpt.local_dir is refused at start.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 2 4000 64
# In memory, as by default: a write to disk (fsync'd) could still be going when the job is killed a step later.
SHM=$(mktemp -d /dev/shm/yuanlm-test.XXXXXX)
trap 'umount "$SHM/small" 2>/dev/null; rm -rf "$WORK" "$SHM"' EXIT
args=(--train.steps=12 --train.global_batch=12 --train.micro_batch=2 --ckpt.every=0 --ckpt.local_every=2
      --ckpt.local_dir="$SHM/%h")
node="$SHM/$(hostname)"  # this host's ckpt.local_dir: a directory of each job's under it
train 2 "$WORK/ref" --train.steps=12 --train.global_batch=12 --train.micro_batch=2 >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; exit 1; }

# killed_run DIR STEP: a 2-rank run of args SIGKILLed in step STEP (its mpirun with it).
killed_run() {
  set +e
  YUANLM_KILL_AT=$2 timeout 60 mpirun -x YUANLM_KILL_AT -np 2 bin/yuanlm train "${TINY[@]}" \
    --data.train="$WORK/corpus/*.h5" --run.dir="$1" "${args[@]}" >"$WORK/killed.log" 2>&1
  local rc=$?
  set -e
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$WORK/killed.log"; echo "expected the killed run to fail, got $rc"; exit 1; }
}

echo "== the snapshots leave the numerics alone"
train 2 "$WORK/same" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
compare "$WORK/ref" "$WORK/same" 0 0
local=$(local_job "$node" "$WORK/same")
[ ! -e "$local" ] || { echo "a run that finished left $local"; ls -R "$local"; exit 1; }

echo "== local checkpoints written and rotated; killed in step 8, resumed on 3 ranks"
killed_run "$WORK/a" 7
local=$(local_job "$node" "$WORK/a")
# Generations 4 and 6 are kept: 6 is the newest, 4 the newest known complete everywhere when 6 was started.
[ "$(cd "$local" && ls -d step_*)" = "$(printf 'step_0000004\nstep_0000006')" ] || { ls -R "$local"; exit 1; }
ls "$local/step_0000006/rank_00000/manifest.json" "$local/step_0000006/rank_00001/optim_00001_000.safetensors" >/dev/null
train 3 "$WORK/a" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks, optimizer state re-cut for 3), step 6; steps lost: 1 (the previous run logged step 7)" "$WORK/log" ||
  { cat "$WORK/log"; exit 1; }
compare "$WORK/ref" "$WORK/a" 1e-5 1e-5

echo "== a corrupted or truncated local file is skipped for the generation before it"
killed_run "$WORK/b" 7
local=$(local_job "$node" "$WORK/b")
grep -q '"crc32c": "[0-9a-f]\{8\}"' "$local/step_0000006/rank_00000/manifest.json" ||
  { cat "$local/step_0000006/rank_00000/manifest.json"; exit 1; }
file="$local/step_0000006/rank_00001/optim_00001_000.safetensors"
printf 'X' | dd of="$file" bs=1 seek=200 conv=notrunc status=none
short="$local/step_0000006/rank_00000/optim_00000_000.safetensors"
truncate -s -4 "$short"
train 2 "$WORK/b" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "skipping local checkpoint $local/step_0000006/rank_00001: $file does not match its checksum" "$WORK/log" ||
  { cat "$WORK/log"; exit 1; }
grep -q "skipping local checkpoint $local/step_0000006/rank_00000: $short does not match its checksum" "$WORK/log" ||
  { cat "$WORK/log"; exit 1; }
grep -q "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks), step 4; steps lost: 3" "$WORK/log" ||
  { cat "$WORK/log"; exit 1; }
compare "$WORK/ref" "$WORK/b" 1e-5 1e-5

echo "== run.dir/ckpt older than node memory is not even hashed; without node memory it is, and refused"
args=("${args[@]/--ckpt.every=0/--ckpt.every=4}")
killed_run "$WORK/e" 7
cp -r "$WORK/e" "$WORK/f"  # the same checkpoints in another run.dir: node memory holds none of its own
for r in e f; do
  printf 'X' | dd of="$(ls "$WORK/$r/ckpt/step_0000004/"*.safetensors | head -1)" bs=1 seek=200 conv=notrunc status=none
done
train 2 "$WORK/e" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "resume: from node memory (2 own copies, 0 partner copies; written by 2 ranks), step 6" "$WORK/log" &&
  ! grep -q "skipping checkpoint" "$WORK/log" || { cat "$WORK/log"; exit 1; }
compare "$WORK/ref" "$WORK/e" 1e-5 1e-5
train 2 "$WORK/f" "${args[@]}" >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }
grep -q "skipping checkpoint $WORK/f/ckpt/step_0000004: .* does not match" "$WORK/log" || { cat "$WORK/log"; exit 1; }

echo "== an unwritable ckpt.local_dir is refused at start"
touch "$WORK/file"
set +e
train 2 "$WORK/c" "${args[@]}" --ckpt.local_dir="$WORK/file/local" >"$WORK/log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "^error: .*ckpt.local_dir $WORK/file/local/yuanlm-[0-9a-f]\{16\} is not writable" "$WORK/log" ||
  { cat "$WORK/log"; echo "rc $rc"; exit 1; }

echo "== a ckpt.local_dir with too little space is refused at start, naming the bytes needed"
mkdir "$SHM/small"
if mount -t tmpfs -o size=64k tmpfs "$SHM/small" 2>"$WORK/mount.log"; then
  set +e
  train 2 "$WORK/d" "${args[@]}" --ckpt.local_dir="$SHM/small" >"$WORK/log" 2>&1
  rc=$?
  set -e
  # Two generations of both ranks' shards (3 x 14016 floats each, and a header allowance): 2 x 2 x 172288 bytes.
  [ "$rc" -ne 0 ] && grep -q "^error: .*ckpt.local_dir $SHM/small/yuanlm-[0-9a-f]\{16\} has [0-9.]* KiB free, and the local checkpoints of node 0 ($(hostname)) need 689152 bytes" "$WORK/log" ||
    { cat "$WORK/log"; echo "rc $rc"; exit 1; }
else
  echo "(not checked: no tmpfs can be mounted here: $(cat "$WORK/mount.log"))"
fi
echo OK
