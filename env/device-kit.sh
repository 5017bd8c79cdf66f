#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run yuanlm's GPU tests, benchmarks and whole training runs, for
# machines that have CUDA and PyTorch but no Open MPI, HDF5, Boost, sentencepiece, OpenBLAS or GoogleTest
# (the device tool's H100/H200). Writes .device/kit.tar.xz (ignored by git), holding:
#   bin/   yuanlm, test_cuda (GoogleTest linked in), bench_gpu_train, bench_gpu_offload, built here for
#          sm_90 and -march=x86-64-v3 (this machine's -march=native would not run on every x86-64)
#   root/  the Debian packages that those binaries, Open MPI's plugins and mpirun load, unpacked with
#          dpkg -x, without CUDA and the base libraries every distribution has (C and C++ runtimes, zlib,
#          OpenSSL, ...): the GPU machine's own are newer, and its Python must keep loading them
#   data/  the demo corpus (tools/demo.sh --prep-only), for the GPU-against-CPU loss curve test
#   env.sh sourced from the repository root there: copies bin/ and data/ in and sets PATH, LD_LIBRARY_PATH,
#          OPAL_PREFIX and YUAN_OPENBLAS
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
make -C "$src" -j"$(nproc)" CUDA=1 CUDA_ARCH=sm_90 ARCH=-march=x86-64-v3 \
  bin/yuanlm bin/test_cuda bin/bench_gpu_train bin/bench_gpu_offload >"$kit/build.log" 2>&1 ||
  { tail -20 "$kit/build.log"; exit 1; }
cp "$src"/bin/{yuanlm,test_cuda,bench_gpu_train,bench_gpu_offload} "$kit/bin/"

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
EOF
tar -cJf .device/kit.tar.xz -C /tmp yuanlm-kit
echo "device-kit: .device/kit.tar.xz, $(du -h .device/kit.tar.xz | cut -f1)"
