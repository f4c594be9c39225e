#!/usr/bin/env bash
# The README's test command: installs dependencies, configures, builds and runs every test.
#   scripts/test.sh               Release-with-assertions build in build-test/, all tests
#   scripts/test.sh --sanitize    also an AddressSanitizer+UBSan build (build-asan/) of the unit
#                                 and MPI tests
# Exits non-zero on any failure. ctest's summary is the last thing printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

sanitize=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

bash scripts/setup-deps.sh

jobs=$(nproc)
# Open MPI refuses to run as root without these; tests pass them explicitly too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

status=0
if [ "$sanitize" = 1 ]; then
  echo "== sanitizer build (address,undefined) =="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSN_SANITIZE=address,undefined \
    -DSN_WITH_MPI=ON -DSN_BUILD_BENCH=OFF
  cmake --build build-asan -j"$jobs"
  # leak checking is on; Open MPI's own allocations are suppressed (tests/lsan.supp)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$root/tests/lsan.supp \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -LE "large|bench" || status=1
fi

echo "== build (RelWithDebInfo, MPI on) =="
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSN_WITH_MPI=ON
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure || status=1
exit $status
