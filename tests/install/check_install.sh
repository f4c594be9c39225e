#!/usr/bin/env bash
# Installs a built syncnorm into a scratch prefix and builds programs against it the ways a user
# would, for each library that was built:
#   libsyncnorm       consumer_c (kernels, SyncBatchNorm without a communicator and on "self", a
#                     checkpoint): plain `cc` with `pkg-config syncnorm` (whose flags must name no
#                     MPI, CUDA or NCCL), shared and static; the CMake package without components,
#                     from a C and a C++-only project (consumer_cxx)
#   libsyncnorm_mpi   consumer_mpi (SyncBatchNorm on MPI_COMM_WORLD): COMPONENTS mpi from C and
#                     from C++ in a C+C++ project (consumer_mixed); pkg-config syncnorm-mpi
#   libsyncnorm_cuda  consumer_cuda: COMPONENTS cuda and pkg-config syncnorm-cuda, compiled and
#                     linked; run where a GPU is (exit 77 without one)
# and checks with readelf -d that libsyncnorm.so needs no libmpi, libcudart or libnccl, and
# libsyncnorm_mpi.so no CUDA library; and that the Python package, installed where an install to
# /usr/local is on /usr/bin/python3's sys.path, finds the installed libraries by itself.
#   check_install.sh BUILD_DIR WORK_DIR
# CTest test install_consumers (label install). Exits non-zero on the first failure.
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

step() { echo "== $*"; }
die() { echo "check_install: $*" >&2; exit 1; }
step "install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(dirname "$(find "$prefix" -name 'libsyncnorm.a' | head -n 1)")
[ -f "$libdir/libsyncnorm.a" ] || die "no libsyncnorm.a installed"
have_mpi=0 have_cuda=0
[ -f "$libdir/libsyncnorm_mpi.so" ] && have_mpi=1
[ -f "$libdir/libsyncnorm_cuda.so" ] && have_cuda=1
echo "installed: libsyncnorm, mpi=$have_mpi, cuda=$have_cuda"

step "readelf -d: what each shared library needs"
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
core_needs=$(needed "$libdir/libsyncnorm.so")
echo "libsyncnorm.so: $(echo $core_needs)"
if echo "$core_needs" | grep -Eq 'mpi|cuda|nccl|stdc\+\+'; then
  die "libsyncnorm.so needs an MPI, CUDA, NCCL or C++ library"
fi
if [ $have_mpi = 1 ]; then
  mpi_needs=$(needed "$libdir/libsyncnorm_mpi.so")
  echo "libsyncnorm_mpi.so: $(echo $mpi_needs)"
  echo "$mpi_needs" | grep -Eq 'cuda|nccl' && die "libsyncnorm_mpi.so needs a CUDA library"
  echo "$mpi_needs" | grep -q '^libmpi' || die "libsyncnorm_mpi.so does not need libmpi"
fi
if [ $have_cuda = 1 ]; then
  echo "libsyncnorm_cuda.so: $(echo $(needed "$libdir/libsyncnorm_cuda.so"))"
  needed "$libdir/libsyncnorm_cuda.so" | grep -q mpi && die "libsyncnorm_cuda.so needs libmpi"
fi
grep -E '^#include' "$prefix/include/syncnorm_dist.h" "$prefix/include/syncnorm.h" |
  grep -Eq 'mpi|nccl|cuda' &&
  die "syncnorm.h or syncnorm_dist.h includes an MPI, NCCL or CUDA header"

# run PROGRAM: exit 0, or 77 for a CUDA program on a machine without a device
run() {
  local rc=0
  "$@" || rc=$?
  [ $rc -eq 0 ] || { [ $rc -eq 77 ] && [[ "$1" == *cuda* ]]; } || die "$* exited $rc"
}

projects=(consumer_c consumer_cxx)
[ $have_mpi = 1 ] && projects+=(consumer_mpi consumer_mixed)
[ $have_cuda = 1 ] && projects+=(consumer_cuda)
for p in "${projects[@]}"; do
  step "find_package(syncnorm CONFIG): $p"
  cmake -S "$here/$p" -B "$work/$p" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$work/$p.log" 2>&1 || { cat "$work/$p.log"; exit 1; }
  cmake --build "$work/$p" >>"$work/$p.log" 2>&1 || { cat "$work/$p.log"; exit 1; }
  mv "$work/$p/app_shared" "$work/$p/$p-shared" && mv "$work/$p/app_static" "$work/$p/$p-static"
  (cd "$work" && run "$work/$p/$p-shared" && run "$work/$p/$p-static")
done
if [ $have_cuda = 1 ]; then # the static link kept the device kernels' registration
  nm "$work/consumer_cuda/consumer_cuda-static" >"$work/consumer_cuda.nm"
  grep -q sn__cuda_syncbn_register "$work/consumer_cuda.nm" ||
    die "libsyncnorm_cuda.a linked without its SyncBatchNorm registration"
fi

export PKG_CONFIG_PATH=$libdir/pkgconfig
cc=${CC:-cc}
# pkg-config's output as words: it escapes spaces in paths with a backslash, as a shell would
pc() { eval "words=($(pkg-config "$@"))"; }
step "pkg-config syncnorm: plain cc, no MPI, CUDA or NCCL flag"
pc --cflags --libs syncnorm
echo "pkg-config --cflags --libs syncnorm: ${words[*]}"
echo " ${words[*]} " | grep -Eiq 'mpi|cuda|nccl' && die "syncnorm.pc names MPI, CUDA or NCCL"
"$cc" -o "$work/pc_shared" "$here/consumer_c/main.c" "${words[@]}" -lm
(cd "$work" && LD_LIBRARY_PATH=$libdir run "$work/pc_shared")
step "pkg-config syncnorm, C++"
"${CXX:-c++}" -o "$work/pc_shared_cxx" -x c++ "$here/consumer_c/main.c" "${words[@]}" -lm
(cd "$work" && LD_LIBRARY_PATH=$libdir run "$work/pc_shared_cxx")
step "pkg-config --static syncnorm, libsyncnorm.a"
pc --cflags syncnorm
cflags=("${words[@]}")
pc --static --libs-only-other --libs-only-l syncnorm
libs=()
for w in "${words[@]}"; do [ "$w" = -lsyncnorm ] || libs+=("$w"); done
pc --static --libs-only-L syncnorm
"$cc" -o "$work/pc_static" "$here/consumer_c/main.c" "${cflags[@]}" "$libdir/libsyncnorm.a" \
  "${words[@]}" "${libs[@]}" -lm
(cd "$work" && run "$work/pc_static")
if [ $have_mpi = 1 ]; then
  step "pkg-config syncnorm-mpi"
  pc --cflags --libs syncnorm-mpi
  "$cc" -o "$work/pc_mpi" "$here/consumer_mpi/main.c" "${words[@]}" -lm
  (cd "$work" && LD_LIBRARY_PATH=$libdir run "$work/pc_mpi")
fi
if [ $have_cuda = 1 ]; then
  step "pkg-config syncnorm-cuda (compiled and linked; run where a GPU is)"
  pc --cflags --libs syncnorm-cuda
  "$cc" -o "$work/pc_cuda" "$here/consumer_cuda/main.c" "${words[@]}" -lm
  (cd "$work" && LD_LIBRARY_PATH=$libdir run "$work/pc_cuda")
fi
pyinit=$(find "$prefix" -path '*/syncnorm/_install.py' | head -n 1)
if [ -n "$pyinit" ] && [ -x /usr/bin/python3 ]; then
  pydir=$(dirname "$(dirname "$pyinit")")
  rel=${pydir#"$prefix"/}
  step "the Python package in $rel: found by /usr/bin/python3 under /usr/local, loads the libraries"
  /usr/bin/python3 -c "import sys; sys.exit(0 if '/usr/local/$rel' in sys.path else
    'an install to /usr/local puts the package in /usr/local/$rel, not on sys.path')"
  (cd "$work" && env -u SYNCNORM_LIBRARY_DIR PYTHONPATH="$pydir" /usr/bin/python3 -c "
import os, syncnorm
assert os.path.samefile(syncnorm.library_dir(), '$libdir'), syncnorm.library_dir()
c = syncnorm.Comm.self_()
print('python: syncnorm', syncnorm.version(), 'from', syncnorm.library_dir(), c)
try:
    import torch, syncnorm.torch as st
    bn = st.SyncBatchNorm(3)
    bn(torch.randn(4, 3, 2, 2))
    assert int(bn.num_batches_tracked) == 1
    print('python: syncnorm.torch ok')
except ImportError:
    print('python: no torch here; syncnorm.torch not tried')
")
fi
step "ok"
