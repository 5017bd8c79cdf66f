# The trainer's traffic accounting (metrics comm_bytes, by group and operation) equals, byte for byte, the volume
# each layout's design implies (tools/comm_volume.py states it): ZeRO 0/1/2/3 on 2 data-parallel ranks with 2
# micro-batches each, tensor parallelism over 2 ranks, a 2-stage pipeline. Groups of one rank count nothing.
source "$(dirname "$0")/lib.sh"
make_corpus "$WORK/corpus" 1 4000 64
L=2 C=32 T=16 V=64 B=2 G=8  # TINY's model
comm_layouts "$WORK" $G $B --train.steps=3
$PY tools/comm_volume.py --exact $L $C $T $V $B $G zero0="$WORK/zero0" zero1="$WORK/zero1" zero2="$WORK/zero2" \
  zero3="$WORK/zero3" tp2="$WORK/tp2" pp2="$WORK/pp2"
