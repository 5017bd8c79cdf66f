#!/usr/bin/env bash
# Puts the cuDNN frontend's headers (header-only C++, MIT; NVIDIA's registry package nvidia-cudnn-frontend, whose
# wheel ships them under include/) in build/cudnn-frontend/include, where the Makefile looks for them. One pinned
# version, checked by its wheel's SHA-256: the emulated cuDNN (cuda/emu/cudnn.cpp) is tested against the graphs this
# version builds. A machine with its own copy sets CUDNN_FRONTEND_HOME instead. Without pip or a network the build
# goes on without cuDNN attention (model.attention = own), and says so; this script then exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
wheel=nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
dest=build/cudnn-frontend

[ -n "${CUDNN_FRONTEND_HOME:-}" ] && exit 0
[ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The wheel of one platform and Python: only its headers are used, which are the same in every wheel.
if ! /usr/bin/python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
     --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version" >"$tmp/pip.log" 2>&1; then
  echo "cudnn-frontend: not fetched ($(tail -1 "$tmp/pip.log")); building without cuDNN attention" >&2
  exit 0
fi
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet ||
  { echo "cudnn-frontend: $wheel does not have the pinned SHA-256 $sha256" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
/usr/bin/python3 - "$tmp/$wheel" "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
echo "$version" >"$dest/VERSION"
echo "cudnn-frontend: $version headers in $dest/include ($(find "$dest/include" -name '*.h' | wc -l) files)"
