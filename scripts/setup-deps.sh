#!/usr/bin/env bash
# Installs (idempotently) every Debian 12 package the build, the tests, the benchmarks and the
# main job need. Only missing packages are installed; `apt-get update` runs only then.
# Usage: scripts/setup-deps.sh        (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake pkg-config        # toolchain
  libopenmpi-dev openmpi-bin              # MPI communicator, mpirun
  check libsubunit-dev                    # unit-test framework
  libjansson-dev                          # JSON header of safetensors checkpoints
  zlib1g-dev libopenblas-dev              # training program: gz IDX files, sgemm
  dataset-fashion-mnist                   # the main job's data
  python3-torch python3-numpy             # PyTorch reference values in tests, syncnorm.torch
  python3-mpi4py python3-pytest           # the Python package's tests (mpi4py communicators)
  libdnnl-dev                             # oneDNN, the benchmark's peer (optional for the library)
  gnuplot-nox                             # training curves picture
  clang libclang-rt-14-dev valgrind       # fuzzing, sanitizers, memcheck
  iproute2                                # network namespaces for the multi-host check
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q "${missing[@]}"
