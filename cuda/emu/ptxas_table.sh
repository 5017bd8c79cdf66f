#!/usr/bin/env bash
# What the GPU compiler made of each kernel, as a table, one line per kernel:
#   MANGLED-NAME REGISTERS STATIC-SHARED-BYTES SPILL-STORE-BYTES SPILL-LOAD-BYTES MAX-THREADS
# from ptxas's report (the stderr of nvcc -Xptxas -v, a .ptxas file per compiled .cu) and the cubin's attributes
# (cuobjdump -elf, a .elf file per cubin: EIATTR_MAX_THREADS, the x * y * z of __launch_bounds__ or .maxntid; 0 for a
# kernel that states none). Arguments: the .elf files, then the .ptxas files.
# The emulator reads it for occupancy and the launch checks (cuda/emu/target.cpp), tests/cuda/test_codegen.sh for
# spills. nvcc and g++ mangle alike (the Itanium ABI) except for anonymous namespaces, which nvcc names after their
# file (_GLOBAL__N__916d138f_12_layernorm_cu_8e6b9ea4) and g++ calls _GLOBAL__N_1: the table spells them as g++
# does, so that the emulator finds its kernels' names in it. A kernel's spills are those of every function ptxas reports
# with it (a callee it did not inline spills for it).
set -euo pipefail
awk '
  function gxx(name,   out, digits, len) {
    out = ""
    while (match(name, /[0-9]+_GLOBAL__N_/)) {
      digits = substr(name, RSTART, RLENGTH - 11)
      len = digits + 0
      out = out substr(name, 1, RSTART - 1) "12_GLOBAL__N_1"
      name = substr(name, RSTART + length(digits) + len)
    }
    return out name
  }
  function hex(s,   v, i) {  # "0x400": awk reads no hex numbers (mawk has no strtonum)
    v = 0
    for (i = 3; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", tolower(substr(s, i, 1))) - 1
    return v
  }
  FILENAME ~ /\.elf$/ {
    if (/^\.nv\.info\./) { info = gxx(substr($0, 10)) }
    else if (/Attribute:.*EIATTR_MAX_THREADS$/) { want = info }
    else if (want != "" && /Value:/) { max_threads[want] = hex($2) * hex($3) * hex($4); want = "" }
    next
  }
  /Compiling entry function/ { k = $0; sub(/^[^\x27]*\x27/, "", k); sub(/\x27.*/, "", k); k = gxx(k); stores = 0; loads = 0 }
  /bytes spill stores/ { stores += $5; loads += $9 }
  /Used [0-9]+ registers/ {
    for (i = 1; i < NF; i++) if ($(i + 1) == "registers,") regs = $i
    smem = match($0, /[0-9]+ bytes smem/) ? substr($0, RSTART, RLENGTH - 11) + 0 : 0
    print k, regs, smem, stores, loads, (k in max_threads) ? max_threads[k] : 0
  }
' "$@"
