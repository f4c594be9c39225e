#!/usr/bin/env bash
# scripts/run.sh — the README's first command: install what is missing, build in Release, train
# the Fashion-MNIST CNN with SyncBatchNorm on 4 MPI ranks for 2 epochs, say where the results are.
#
# Usage: scripts/run.sh [--np N] [syncnorm-train options...]    (--help: this, and its options)
#   --np N   number of MPI ranks (default 4); every other argument goes to syncnorm-train, after
#            the default --epochs 2 (so --epochs 5 overrides it). See syncnorm-train --help.
# Examples: scripts/run.sh
#           scripts/run.sh --epochs 5 --np 2
#           scripts/run.sh --np 1 --batch 32 --out runs/1x32
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-release"

np=4
out="runs/latest"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --np) [ $# -ge 2 ] || { echo "run.sh: --np needs a value" >&2; exit 2; }; np="$2"; shift 2 ;;
    --np=*) np="${1#--np=}"; shift ;;
    --out) [ $# -ge 2 ] && out="$2"; args+=("$1"); shift ;;
    --out=*) out="${1#--out=}"; args+=("$1"); shift ;;
    -h | --help) # this header, then syncnorm-train's options where it is built; nothing runs
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
      if [ -x "$build/examples/syncnorm-train" ]; then
        echo
        "$build/examples/syncnorm-train" --help
      else
        echo "(syncnorm-train --help lists the rest once built: $build/examples/syncnorm-train)"
      fi
      exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$np" in
  '' | *[!0-9]* | 0) echo "run.sh: --np must be a positive integer, got '$np'" >&2; exit 2 ;;
esac

start=$(date +%s)
bash "$root/scripts/setup-deps.sh"

echo "run.sh: building (Release) in $build"
mkdir -p "$build"
log="$build/run-sh-build.log"
{ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSN_WITH_MPI=ON &&
  cmake --build "$build" --target syncnorm-train -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"; } >"$log" 2>&1 ||
  { tail -n 40 "$log" >&2; echo "run.sh: build failed (whole log: $log)" >&2; exit 1; }
prog="$build/examples/syncnorm-train"

# mpirun flags: root needs --allow-run-as-root (containers); more ranks than cores need
# --oversubscribe, and then ranks must yield the CPU while they wait in collectives (Open MPI
# does this by itself when it sees the oversubscription; the variable makes it explicit).
# --bind-to none: one rank may use several threads (--threads), and ranks sharing cores
# should be scheduled by the kernel rather than pinned.
mpi_flags=(--bind-to none)
cores=$(nproc)
if [ "$(id -u)" -eq 0 ]; then
  mpi_flags+=(--allow-run-as-root --oversubscribe)
elif [ "$np" -gt "$cores" ]; then
  mpi_flags+=(--oversubscribe)
fi
if [ "$np" -gt "$cores" ]; then
  export OMPI_MCA_mpi_yield_when_idle=1
fi
cd "$root"
echo "run.sh: mpirun -np $np ${mpi_flags[*]} $prog --epochs 2 ${args[*]}"
mpirun -np "$np" "${mpi_flags[@]}" "$prog" --epochs 2 "${args[@]}"

case "$out" in /*) where="$out" ;; *) where="$root/$out" ;; esac
echo "run.sh: done in $(( $(date +%s) - start )) s; results in $where:"
ls -l "$where"
