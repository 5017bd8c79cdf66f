#!/usr/bin/env bash
# `make run`: the built-in demo. Preps Debian's fortunes-zh (Tang poems, Song ci, Chinese quotations) into
# HDF5 shards with a 4000-piece BPE tokenizer trained on it, then trains input/tiny.ini on the CPU under
# `mpirun -np 2`. Extra arguments go to `yuanlm train` (e.g. --train.steps=50); `--prep-only` stops after the
# corpus is in data/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fortunes=/usr/share/games/fortunes
if [ ! -f data/demo/manifest.json ]; then
  bin/yuanlm prep --input "$fortunes/tang300" "$fortunes/song100" "$fortunes/chinese" --format fortune \
    --train-tokenizer --vocab-size 4000 --out data/demo --shard-tokens 262144 --val-fraction 0.05 --seed 1
fi
[ "${1:-}" = --prep-only ] && exit 0
mpirun -np 2 --mca btl_vader_single_copy_mechanism none bin/yuanlm train input/tiny.ini "$@"
