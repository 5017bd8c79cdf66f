#!/usr/bin/env bash
# `make run-bpe`: the demo with a GPT-2-style byte-level BPE, the way llm.c trains GPT-2 on a small corpus: Debian's
# fortunes-zh tokenized with the BPE tokenizer.json that tools/make_bpe_fixture.py trained on it with HuggingFace
# `tokenizers` (tests/data/bpe, 800 ids, <|endoftext|> between documents), input/tiny.ini trained on it on the CPU
# under `mpirun -np 2`, then text sampled from the last checkpoint through the tokenizer it carries. Extra arguments
# go to `yuanlm train` (e.g. --train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fortunes=/usr/share/games/fortunes
if [ ! -f data/demo-bpe/manifest.json ]; then
  bin/yuanlm prep --input "$fortunes/tang300" "$fortunes/song100" "$fortunes/chinese" --format fortune \
    --tokenizer tests/data/bpe/tokenizer.json --out data/demo-bpe --shard-tokens 524288 --val-fraction 0.05 --seed 1
fi
mpirun -np 2 --mca btl_vader_single_copy_mechanism none bin/yuanlm train input/tiny.ini --model.vocab_size=800 \
  --data.train='data/demo-bpe/train_*.h5' --data.val='data/demo-bpe/val_*.h5' --run.dir=runs/tiny-bpe "$@"
bin/yuanlm sample --checkpoint runs/tiny-bpe --prompt "床前明月光，" --tokens 64 --seed 1
