#!/usr/bin/env bash
# valgrind memcheck over the single-process tests (the "Valgrind" section of docs/RELIABILITY.md).
#   scripts/valgrind.sh             configure build-valgrind/ (gcc, RelWithDebInfo, no sanitizer),
#                                   build, run every test not labelled mpi, large, bench, fuzz or
#                                   torch under memcheck through `ctest -T memcheck`
#   scripts/valgrind.sh -R REGEX    only the tests matching REGEX (passed on to ctest)
#   scripts/valgrind.sh -j N        N tests at a time (default: the number of cores)
# A test fails on any memcheck error (invalid read/write, uninitialised value used, bad free) and
# on any definite or indirect leak (--errors-for-leak-kinds); the script then exits non-zero and
# lists the logs (build-valgrind/Testing/Temporary/MemoryChecker.*.log).
# Check runs each test in-process (CK_FORK=no), so the leak check covers the test's own process.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

jobs=$(nproc)
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=${2:?-j needs a number}; shift ;;
    -R) extra+=(-R "${2:?-R needs a regex}"); shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "valgrind.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind not found (apt-get install valgrind)" >&2; exit 2; }

build="build-valgrind"
start=$(date +%s)
opts="--tool=memcheck --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect"
opts="$opts --errors-for-leak-kinds=definite,indirect --track-origins=yes --num-callers=30"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSN_SANITIZE= -DSN_WITH_MPI=ON -DSN_WITH_CUDA=OFF \
  -DSN_BUILD_BENCH=OFF -DSN_TEST_TORCH=OFF -DSN_TEST_TIMEOUT_SCALE=30 \
  -DMEMORYCHECK_COMMAND="$(command -v valgrind)" -DMEMORYCHECK_COMMAND_OPTIONS="$opts" \
  -DMEMORYCHECK_SUPPRESSIONS_FILE="$root/tests/valgrind.supp" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
built=$(date +%s)

# OpenMP: two threads (valgrind serializes them, but the threaded code paths run); libgomp's
# threads must not spin on a serialized CPU.
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive CK_FORK=no
status=0
ctest --test-dir "$build" -T memcheck -LE "mpi|large|bench|fuzz|torch|install" -j"$jobs" \
  --output-on-failure "${extra[@]}" || status=1
logs=$(find "$build/Testing/Temporary" -name 'MemoryChecker.*.log' -size +0 2>/dev/null | sort)
echo "== valgrind: build $((built - start)) s, tests $(( $(date +%s) - built )) s =="
if [ "$status" != 0 ]; then
  echo "valgrind.sh: memcheck found errors or leaks; logs:" >&2
  echo "$logs" >&2
fi
exit $status
