#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run yuanlm's GPU tests, benchmarks and whole training runs, for
# machines that have CUDA and PyTorch but no Open MPI, HDF5, Boost, sentencepiece, OpenBLAS or GoogleTest
# (the device tool's H100/H200). Writes .device/kit.tar.xz (ignored by git), holding:
#   bin/   yuanlm, test_cuda (GoogleTest linked in), bench_gpu_train, bench_gpu_offload, bench_gpu_attention,
#          built here for sm_90 and -march=x86-64-v3 (this machine's -march=native would not run on every x86-64),
#          with this checkout's cuDNN frontend headers (build/cudnn-frontend, from make deps) for the cuDNN attention
#   root/  the Debian packages that those binaries, Open MPI's plugins and mpirun load, unpacked with
#          dpkg -x, without CUDA and the base libraries every distribution has (C and C++ runtimes, zlib,
#          OpenSSL, ...): the GPU machine's own are newer, and its Python must keep loading them
#   data/  the demo corpus (tools/demo.sh --prep-only), for the GPU-against-CPU loss curve test
#   env.sh sourced from the repository root there: copies bin/ and data/ in and sets PATH, LD_LIBRARY_PATH,
#          OPAL_PREFIX and YUAN_OPENBLAS; where libcudnn.so.9 is not loadable, adds the copy in PyTorch's wheels
#          to LD_LIBRARY_PATH, and says which it found
# On the GPU machine, carry `.device` and start with
#   tar -xJf .device/kit.tar.xz -C /tmp && source /tmp/yuanlm-kit/env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
src=/tmp/yuanlm-kit-src
kit=/tmp/yuanlm-kit
rm -rf "$kit" "$src"
mkdir -p "$src" "$kit/bin" "$kit/debs" "$kit/data" .device

# A copy of the sources (tracked and new files, nothing ignored), so that this checkout's native build is left
# alone.
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$src"
echo "device-kit: building for sm_90, x86-64-v3 in $src"
# The frontend's headers are fetched, not tracked (git ls-files leaves them out): the copy builds with this
# checkout's, without which its binaries would run own attention only.
frontend=$PWD/build/cudnn-frontend
[ -e "$frontend/include/cudnn_frontend.h" ] ||
  echo "device-kit: no cuDNN frontend in $frontend (make deps fetches it): the kit runs own attention only"
bins="yuanlm test_cuda bench_gpu_train bench_gpu_offload bench_gpu_attention"
make -C "$src" -j"$(nproc)" CUDA=1 CUDA_ARCH=sm_90 ARCH=-march=x86-64-v3 CUDNN_FRONTEND_HOME="$frontend" \
  $(printf 'bin/%s ' $bins) >"$kit/build.log" 2>&1 || { tail -20 "$kit/build.log"; exit 1; }
for b in $bins; do cp "$src/bin/$b" "$kit/bin/"; done

# owner FILE: the Debian package that installed FILE (merged /usr: dpkg may know it under /lib or /usr/lib).
owner() {
  local f=$1
  dpkg -S "$f" 2>/dev/null || dpkg -S "$(readlink -f "$f")" 2>/dev/null || dpkg -S "/usr$f" 2>/dev/null ||
    dpkg -S "${f#/usr}" 2>/dev/null || true
}
mpi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
libs=$(ldd "$kit"/bin/* "$mpi_plugins"/*.so /usr/bin/orterun /usr/bin/orted 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
pkgs=$(for l in $libs; do owner "$l"; done | cut -d: -f1 | sort -u |
  grep -vxE 'libc6|libstdc\+\+6|libgcc-s1|libgomp1|libatomic1|zlib1g|libzstd1|libssl3|libffi8|libudev1|libuuid1' ||
  true)
pkgs="$pkgs libopenblas0-openmp libopenmpi3 openmpi-bin openmpi-common"
echo "device-kit: packages: $(echo $pkgs | tr '\n' ' ')"
(cd "$kit/debs" && apt-get -o APT::Sandbox::User=root download $pkgs >/dev/null)
for d in "$kit"/debs/*.deb; do dpkg -x "$d" "$kit/root"; done
rm -rf "$kit/debs" "$kit/root/usr/share/doc" "$kit/root/usr/share/man" "$kit/root/usr/share/locale"
find "$kit/root" -name '*.a' -delete
ln -s orterun "$kit/root/usr/bin/mpirun"  # Debian makes this link with update-alternatives, which dpkg -x skips

tools/demo.sh --prep-only
cp -r data/demo "$kit/data/"

cat >"$kit/env.sh" <<'EOF'
# Source from the repository root on the GPU machine (see env/device-kit.sh).
kit=/tmp/yuanlm-kit
mkdir -p bin data
cp "$kit"/bin/* bin/
cp -r "$kit"/data/demo data/
lib=$kit/root/usr/lib/x86_64-linux-gnu
export PATH=$kit/root/usr/bin:$PATH
export LD_LIBRARY_PATH=$lib:$kit/root/lib/x86_64-linux-gnu:$lib/openmpi/lib:$lib/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$kit/root/usr YUAN_OPENBLAS=$lib/openblas-openmp/libopenblas.so.0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export PY=python3  # for tests/mpi/lib.sh: no Debian python there
# One node and no ssh there: mpirun starts the ranks itself instead of looking for an rsh agent.
export OMPI_MCA_plm=isolated
# The cuDNN attention loads libcudnn.so.9 at run time. Where the loader does not find it, PyTorch's wheels may hold
# it (nvidia-cudnn-cu12's nvidia/cudnn/lib, or torch/lib): located without importing torch, by whichever Python
# there is.
cudnn_loadable() { "$1" -c 'import ctypes; ctypes.CDLL("libcudnn.so.9")' 2>/dev/null; }
cudnn_dir=
for py in /usr/bin/python3 python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  if cudnn_loadable "$py"; then cudnn_dir=loadable; break; fi
  cudnn_dir=$("$py" -c '
import glob, importlib.util, os
for name in ("nvidia.cudnn", "torch"):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # no "nvidia" package at all
        continue
    for root in (spec.submodule_search_locations or []) if spec else []:
        if glob.glob(os.path.join(root, "lib", "libcudnn.so.9*")):
            print(os.path.join(root, "lib"))
            raise SystemExit
' 2>/dev/null)
  [ -n "$cudnn_dir" ] && break
done
case $cudnn_dir in
  loadable) echo "env.sh: libcudnn.so.9 is loadable as it is" ;;
  "") echo "env.sh: no libcudnn.so.9 found: model.attention = auto runs own attention" ;;
  *) export LD_LIBRARY_PATH=$cudnn_dir:$LD_LIBRARY_PATH
     echo "env.sh: libcudnn.so.9 from $cudnn_dir" ;;
esac
unset -f cudnn_loadable
EOF
tar -cJf .device/kit.tar.xz -C /tmp yuanlm-kit
echo "device-kit: .device/kit.tar.xz, $(du -h .device/kit.tar.xz | cut -f1)"
