#!/bin/sh
# Moves the __shared__ variables of an emulator object file into the yuan_emu_shared section, where the emulator's
# checks find them (cuda/emu/symbols.cpp). cuda_runtime.h cannot name the section itself: GCC drops a section
# attribute from the function-local statics of function templates (classifier_kernel<Pass>'s arrays landed in
# .bss). What does survive instantiation is the 64 KiB alignment __shared__ asks for, and with -fdata-sections
# each such variable has a .bss.<symbol> section of its own with that alignment: those are renamed here. Nothing
# else in the build asks for 64 KiB alignment.
# Usage: gather_shared.sh OBJECT
set -e
renames=$(readelf -SW "$1" | sed -n 's/^ *\[ *[0-9]*\] //p' |
  awk '$2 == "NOBITS" && $1 ~ /^\.bss\./ && $NF == 65536 { printf " --rename-section %s=yuan_emu_shared", $1 }')
[ -z "$renames" ] || objcopy $renames "$1"
