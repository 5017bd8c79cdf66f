#!/usr/bin/env bash
# Installs the Debian packages yuanlm needs (Debian 12 / Ubuntu 22.04+). Skips what is present. Without root it
# prints what to install (or, on a cluster, which modules to load) instead.
set -euo pipefail
pkgs=(
  g++ make pkg-config                      # toolchain
  libopenmpi-dev openmpi-bin               # MPI: rendezvous, CPU collectives, mpirun
  libhdf5-dev hdf5-tools                   # sharded corpus; h5dump in the tests
  libboost-program-options-dev             # config decks and command line
  nlohmann-json3-dev                       # JSON: safetensors headers, state.json, manifest, metrics
  libssl-dev                               # sha256 checksums (libcrypto)
  libboost-context-dev                     # the CUDA emulator's thread switches (cuda/emu)
  libgtest-dev                             # tests
  libsentencepiece-dev sentencepiece       # tokenizer training and encoding
  libpcre2-dev                             # byte-level BPE's pre-tokenizer patterns (GPT-2 tokenizers)
  libopenblas-openmp-dev                   # CPU GEMM (the OpenMP build: see src/ops/matmul.cpp)
  fortunes-zh                              # the demo corpus (Tang poems, Song ci, quotations)
  python3-h5py python3-numpy               # test fixtures written by a second HDF5 writer
  python3-torch python3-matplotlib         # PyTorch reference fixtures, benchmarks' peer, plots
  python3-pip                              # NVIDIA's compiler wheels for tests/cuda/test_codegen.sh without a toolkit
  slurm-wlm munge                          # the tests' one-node SLURM (tests/slurm/start.sh)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#pkgs[@]} packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing ${missing[*]}" >&2
  echo "deps: as root run: apt-get install ${missing[*]}" >&2
  echo "deps: on a cluster without root: module load openmpi hdf5 boost cuda and build with MPI_HOME=... HDF5_HOME=... (see README)" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
