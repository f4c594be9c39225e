#!/usr/bin/env bash
# Installs a built syncnorm into a scratch prefix and builds programs against it the ways a user
# would: find_package(syncnorm CONFIG) from a C project, a C++-only project and a C++ program in
# a project with both languages, and pkg-config (shared, and static with libsyncnorm.a), from C
# and from C++; each program must run and pass its check (consumer_c/main.c: with MPI, also a
# SyncBatchNorm layer on MPI_COMM_WORLD, one process).
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
step "install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(dirname "$(find "$prefix" -name 'libsyncnorm.a' | head -n 1)")
[ -f "$libdir/libsyncnorm.a" ] || { echo "no libsyncnorm.a installed" >&2; exit 1; }

for p in consumer_c consumer_cxx consumer_mixed; do
  step "find_package(syncnorm CONFIG): $p"
  cmake -S "$here/$p" -B "$work/$p" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$work/$p.log" 2>&1 || { cat "$work/$p.log"; exit 1; }
  cmake --build "$work/$p" >>"$work/$p.log" 2>&1 || { cat "$work/$p.log"; exit 1; }
  "$work/$p/app_shared"
  "$work/$p/app_static"
done

export PKG_CONFIG_PATH=$libdir/pkgconfig
cc=${CC:-cc}
# pkg-config's output as words: it escapes spaces in paths with a backslash, as a shell would
pc() { eval "words=($(pkg-config "$@"))"; }
step "pkg-config, shared"
pc --cflags --libs syncnorm
"$cc" -o "$work/pc_shared" "$here/consumer_c/main.c" "${words[@]}" -lm
LD_LIBRARY_PATH=$libdir "$work/pc_shared"
step "pkg-config, shared, C++"
"${CXX:-c++}" -o "$work/pc_shared_cxx" -x c++ "$here/consumer_c/main.c" "${words[@]}" -lm
LD_LIBRARY_PATH=$libdir "$work/pc_shared_cxx"
step "pkg-config --static, libsyncnorm.a"
pc --cflags syncnorm
cflags=("${words[@]}")
pc --static --libs-only-other --libs-only-l syncnorm
libs=()
for w in "${words[@]}"; do [ "$w" = -lsyncnorm ] || libs+=("$w"); done
pc --static --libs-only-L syncnorm
"$cc" -o "$work/pc_static" "$here/consumer_c/main.c" "${cflags[@]}" "$libdir/libsyncnorm.a" \
  "${words[@]}" "${libs[@]}" -lm
"$work/pc_static"
step "ok"
