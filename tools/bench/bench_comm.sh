#!/usr/bin/env bash
# Communication per step and speed of each parallel layout on 2 ranks of the CPU backend: what the trainer counted
# (metrics comm_bytes) against what the layout's design implies (tools/comm_volume.py states both), and the step's
# tokens/s as a ratio to ZeRO-0's, measured in the same run (mean of steps 3-6). tests/mpi/test_comm_volume.sh
# holds the counts to the design exactly on a smaller model.
source "$(dirname "$0")/../../tests/mpi/lib.sh"
make_corpus "$WORK/corpus" 1 40000 4096
L=4 C=256 T=128 V=4096 B=2 G=8
model=(--model.n_layer=$L --model.n_head=4 --model.n_embd=$C --model.seq_len=$T --model.vocab_size=$V
       --train.steps=6 --train.log_every=1)
echo "model: $L blocks x $C wide, seq $T, vocab $V; micro-batch $B, global batch $G, 2 ranks, $(nproc --all) cores"
comm_layouts "$WORK" $G $B "${model[@]}"
$PY tools/comm_volume.py $L $C $T $V $B $G zero0="$WORK/zero0" zero1="$WORK/zero1" zero2="$WORK/zero2" \
  zero3="$WORK/zero3" tp2="$WORK/tp2" pp2="$WORK/pp2"
