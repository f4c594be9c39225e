#!/usr/bin/env bash
# Fuzzing with libFuzzer (clang 14, AddressSanitizer + UBSan) — see tests/fuzz/ and the
# "Fuzzing" section of docs/RELIABILITY.md.
#   scripts/fuzz.sh                   configure build-fuzz/ (clang), build, run each target 600 s,
#                                     one after the other, starting from the committed corpus
#   scripts/fuzz.sh --time S          run each target S seconds instead
#   scripts/fuzz.sh --smoke           CI: every committed corpus input, then 5 s of fuzzing per
#                                     target (the CTest tests labelled "fuzz"; < 2 min with the build)
#   scripts/fuzz.sh --target T        only target T (safetensors, idx, kernels); repeatable
#   scripts/fuzz.sh --update-corpus   after the runs, rewrite tests/fuzz/corpus/fuzz_<T>/ as its
#                                     seed-* and regress-* files plus a small set of the inputs
#                                     found (libFuzzer -set_cover_merge on edge coverage)
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory, or a
# harness check); the reproducer is build-fuzz/tests/fuzz/artifacts/<target>-crash-*: replay it
# with build-fuzz/tests/fuzz/fuzz_<target> <file> (SN_FUZZ_DEBUG=1 traces the kernel calls).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

seconds=600
smoke=0
update=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds=${2:?--time needs seconds}; shift ;;
    --time=*) seconds=${1#--time=} ;;
    --smoke) smoke=1 ;;
    --target) targets+=("${2:?--target needs a name}"); shift ;;
    --update-corpus) update=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=(safetensors idx kernels)
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: --time needs a whole number of seconds" >&2; exit 2 ;; esac

if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi

build="build-fuzz"
start=$(date +%s)
echo "== configure and build $build (clang, address+undefined, libFuzzer) =="
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSN_BUILD_FUZZERS=ON -DSN_SANITIZE=address,undefined \
  -DSN_WITH_MPI=OFF -DSN_WITH_CUDA=OFF -DSN_WITH_NCCL=OFF \
  -DSN_BUILD_BENCH=OFF -DSN_BUILD_EXAMPLES=OFF -DSN_TEST_TORCH=OFF >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
names=()
for t in "${targets[@]}"; do names+=("fuzz_$t"); done
cmake --build "$build" -j"${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target "${names[@]}"
echo "   built in $(( $(date +%s) - start )) s"

# The same settings as the CTest smoke tests (tests/fuzz/CMakeLists.txt). A huge allocation
# aborts (allocator_may_return_null=0): sizes taken from untrusted bytes are findings.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} KMP_BLOCKTIME=0
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

fdir=$build/tests/fuzz
if [ "$smoke" = 1 ]; then
  regex=$(printf '|fuzz_%s_smoke' "${targets[@]}")
  ctest --test-dir "$build" -L fuzz -R "${regex#|}" --output-on-failure
  echo "fuzz.sh --smoke: no finding ($(( $(date +%s) - start )) s including the build)"
  exit 0
fi

status=0
mkdir -p "$fdir/logs" "$fdir/artifacts"
summary=$fdir/logs/summary.txt
: >"$summary"
for t in "${targets[@]}"; do
  corpus=tests/fuzz/corpus/fuzz_$t
  work=$fdir/work/$t
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log=$fdir/logs/$t.log
  echo "== fuzz_$t: ${seconds} s, corpus $corpus (+ $work), log $log =="
  rc=0
  t0=$(date +%s)
  "$fdir/fuzz_$t" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$fdir/artifacts/$t-" "${dict[@]}" "$work" "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\) ft: \([0-9]*\) corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/cov \1, ft \2, corpus \3/p' <<<"$last")
  line="fuzz_$t: $(( $(date +%s) - t0 )) s, ${execs:-?} executions (${rate:-?}/s), $cov, exit $rc"
  echo "   $line"
  echo "$line" >>"$summary"
  if [ "$rc" != 0 ]; then
    status=1
    echo "   FINDING in fuzz_$t:" >&2
    grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY|Test unit written' "$log" | head -20 >&2 || true
  fi
done

if [ "$update" = 1 ]; then
  for t in "${targets[@]}"; do
    corpus=tests/fuzz/corpus/fuzz_$t
    merged=$(mktemp -d)
    # greedy set cover on edge coverage (-use_counters=0): a small set reaching every edge
    "$fdir/fuzz_$t" -set_cover_merge=1 -use_counters=0 "$merged" "$corpus" "$fdir/work/$t" \
      >"$fdir/logs/$t.merge.log" 2>&1
    find "$corpus" -type f ! -name 'seed-*' ! -name 'regress-*' -delete
    for f in "$merged"/*; do
      [ -e "$f" ] || continue
      keep=1
      for g in "$corpus"/seed-* "$corpus"/regress-*; do
        if [ -e "$g" ] && cmp -s "$f" "$g"; then keep=0; break; fi
      done
      [ "$keep" = 1 ] && cp "$f" "$corpus/"
    done
    rm -rf "$merged"
    echo "   corpus fuzz_$t: $(find "$corpus" -type f | wc -l) files, $(cat "$corpus"/* | wc -c) bytes"
  done
fi

echo "== summary ($(( $(date +%s) - start )) s) =="
cat "$summary"
[ "$status" = 0 ] && echo "fuzz.sh: no finding" || echo "fuzz.sh: FINDINGS (see above)" >&2
exit $status
