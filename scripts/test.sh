#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test.
#   scripts/test.sh           all passes: AddressSanitizer+UBSan build of the unit and MPI tests
#                             (build-asan/, without CUDA: nvcc takes no sanitizer flags),
#                             fuzzers' smoke run over their corpus (build-fuzz/),
#                             the kernel tests built for the x86-64 and x86-64-v3 baselines
#                             without target_clones (build-isa-*/, x86-64 only), the
#                             Release build of the library and benchmarks, compiled only
#                             (build-release/: the warnings only -O3 finds), then the
#                             RelWithDebInfo build with every test (build-test/; it compiles the
#                             CUDA kernels where nvcc is found, warnings as errors; their tests
#                             report SKIPPED without a GPU: scripts/gpu-check.sh runs them)
#   scripts/test.sh --quick   only the RelWithDebInfo build and its tests
# Exits non-zero if any pass fails. The last pass's ctest summary is the last thing printed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

bash scripts/setup-deps.sh || exit 1

jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} # build jobs; set CMAKE_BUILD_PARALLEL_LEVEL to change
# Open MPI refuses to run as root without these (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failed=()

if [ "$quick" = 0 ]; then
  echo "== 1/5 sanitizers: address,undefined (build-asan) =="
  if cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSN_SANITIZE=address,undefined \
       -DSN_WITH_MPI=ON -DSN_WITH_CUDA=OFF -DSN_WITH_NCCL=OFF -DSN_BUILD_BENCH=OFF >/dev/null &&
     cmake --build build-asan -j"$jobs" >build-asan.log 2>&1; then
    # Leaks are checked; Open MPI's own allocations are suppressed (tests/lsan.supp), which needs
    # full stacks (fast_unwind_on_malloc=0). The >2^31-element test and the soak run in pass 5.
    ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1 \
    LSAN_OPTIONS=suppressions=$root/tests/lsan.supp \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir build-asan --output-on-failure -LE "large|bench|soak|multihost|install" ||
      failed+=("sanitizers")
  else
    tail -n 40 build-asan.log
    failed+=("sanitizer build")
  fi

  echo "== 2/5 fuzzers: smoke run over the corpus (build-fuzz) =="
  bash scripts/fuzz.sh --smoke || failed+=("fuzz smoke")

  # The kernels' hot functions are compiled three times (target_clones: x86-64-v4, x86-64-v3,
  # baseline) and a machine runs one; the tests below run the other two, each built on its own
  # without clones (SN_NO_CLONES) for that ISA. A machine without AVX2 skips x86-64-v3.
  echo "== 3/5 the kernel tests at the x86-64 and x86-64-v3 baselines (build-isa-*) =="
  if [ "$(uname -m)" != x86_64 ]; then
    echo "not x86-64: no target_clones, nothing to run"
  else
    for isa in x86-64 x86-64-v3; do
      if [ "$isa" = x86-64-v3 ] && ! grep -qw avx2 /proc/cpuinfo; then
        echo "$isa: this CPU has no AVX2, skipped"
        continue
      fi
      if cmake -S . -B "build-isa-$isa" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DCMAKE_C_FLAGS="-DSN_NO_CLONES -march=$isa" -DSN_WITH_MPI=OFF -DSN_WITH_CUDA=OFF \
           -DSN_WITH_NCCL=OFF -DSN_TEST_TORCH=OFF -DSN_BUILD_BENCH=OFF -DSN_BUILD_EXAMPLES=OFF >/dev/null &&
         cmake --build "build-isa-$isa" -j"$jobs" >"build-isa-$isa.log" 2>&1; then
        ctest --test-dir "build-isa-$isa" --output-on-failure -L unit -LE large \
          -R "convert|layernorm|rmsnorm|batchnorm|groupnorm|fold|overlap|stream_bitwise|threads_special" ||
          failed+=("tests at $isa")
      else
        tail -n 40 "build-isa-$isa.log"
        failed+=("build at $isa")
      fi
    done
  fi

  # The configuration docs/BENCHMARKS.md builds the benchmarks with (Release: -O3, CUDA where
  # nvcc is found): GCC's -O3 warns where -O2 does not (a maybe-uninitialized in a .cu file's
  # host code once broke it while every test passed), and -Werror makes that a failed build.
  echo "== 4/5 the Release build of the library and benchmarks, compiled only (build-release) =="
  if ! { cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSN_BUILD_TESTS=OFF \
           -DSN_BUILD_EXAMPLES=OFF >/dev/null &&
         cmake --build build-release -j"$jobs" >build-release.log 2>&1; }; then
    tail -n 40 build-release.log
    failed+=("Release build")
  fi
fi

echo "== 5/5 RelWithDebInfo build, every test (build-test) =="
if cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSN_WITH_MPI=ON >/dev/null &&
   cmake --build build-test -j"$jobs" >build-test.log 2>&1; then
  ctest --test-dir build-test --output-on-failure || failed+=("tests")
else
  tail -n 40 build-test.log
  failed+=("build")
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
exit 0
