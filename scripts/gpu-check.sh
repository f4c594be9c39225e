#!/usr/bin/env bash
# For a machine with an NVIDIA GPU: configures and builds the CUDA kernels, runs the CUDA tests
# (tests/cuda: every CUDA kernel against the CPU one, SyncBatchNorm over NCCL, graph replay) and
# the CUDA benchmark (bench/bench_cuda.cu), and prints a short table last. About 3 minutes on one
# H200 (most of it the build).
#   scripts/gpu-check.sh [--build-dir DIR] [--no-build] [--reps R] [--quick]
#     --build-dir DIR  build tree (default build-gpu)
#     --no-build       use DIR as it is (built elsewhere for this GPU: CMAKE_CUDA_ARCHITECTURES)
#     --reps R         timed launches per kernel in the benchmark (default 50)
#     --quick          the benchmark on small shapes only
# Needs what scripts/setup-deps.sh installs (on Debian) plus the CUDA toolkit with nvcc and NCCL
# (CUDACXX or /usr/local/cuda; NCCL_HOME where NCCL lies elsewhere). CUDA architectures: the
# GPUs of this machine (CMAKE_CUDA_ARCHITECTURES=native), or SN_CUDA_ARCHS. Exits non-zero when
# a test fails or no GPU is found (the tests then report SKIPPED, which here is a failure).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

dir=build-gpu
build=1
reps=50
quick=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) dir=$2; shift ;;
    --no-build) build=0 ;;
    --reps) reps=$2; shift ;;
    --quick) quick=(--quick) ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

t0=$(date +%s)
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi

if [ "$build" = 1 ]; then
  echo "== configure and build ($dir) =="
  if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSN_WITH_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="${SN_CUDA_ARCHS:-native}" -DSN_BUILD_EXAMPLES=OFF \
       -DSN_TEST_TORCH=OFF -DSN_BENCH_WITH_DNNL=OFF \
       >"$dir.configure.log" 2>&1; then
    tail -n 30 "$dir.configure.log"
    echo "gpu-check.sh: configure failed" >&2
    exit 1
  fi
  targets=(syncnorm bench_cuda test_cuda_args test_cuda_rownorm test_cuda_batchnorm
           test_cuda_groupnorm)
  grep -q "NCCL=1" "$dir.configure.log" && targets+=(test_cuda_syncbn)
  if ! cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}" >"$dir.build.log" 2>&1; then
    tail -n 40 "$dir.build.log"
    echo "gpu-check.sh: build failed" >&2
    exit 1
  fi
fi

echo "== CUDA tests =="
results=()
failed=0
for t in test_cuda_args test_cuda_rownorm test_cuda_batchnorm test_cuda_groupnorm \
  test_cuda_syncbn; do
  exe="$dir/tests/cuda/$t"
  [ -x "$exe" ] || { results+=("$t: not built"); continue; }
  s=$(date +%s.%N)
  timeout 600 "$exe" >"$dir/$t.log" 2>&1
  rc=$?
  secs=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  summary=$(grep -E "^[0-9]+%: Checks" "$dir/$t.log" | tail -n 1)
  case $rc in
    0) results+=("$t: passed ($summary) ${secs}s") ;;
    77) results+=("$t: SKIPPED ($(grep -m1 SKIPPED "$dir/$t.log"))"); failed=1 ;;
    *) results+=("$t: FAILED rc=$rc ($summary) ${secs}s"); failed=1
       grep -E ":[EF]:" "$dir/$t.log" | head -n 20 ;;
  esac
done

echo "== CUDA benchmark =="
"$dir/bench/bench_cuda" --reps "$reps" "${quick[@]}" | tee "$dir/bench_cuda.log" || failed=1

echo "== summary ($(($(date +%s) - t0)) s) =="
printf '%s\n' "${results[@]}"
grep -E "^(device|copy)" "$dir/bench_cuda.log"
sed -n '/^kernel /,$p' "$dir/bench_cuda.log"
exit $failed
