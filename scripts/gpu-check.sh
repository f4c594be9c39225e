#!/usr/bin/env bash
# The GPU check, in one call on a machine with an NVIDIA GPU and no network: configures and
# builds libsyncnorm_cuda and its tests, runs the CUDA tests (every CUDA kernel against the CPU
# one, SyncBatchNorm over NCCL, graph replay) and the CUDA benchmark, and ends with a table.
#   scripts/gpu-check.sh --fetch [--deps DIR]     here, with Debian's registry: download the
#                                                 packages the check needs into DIR
#   scripts/gpu-check.sh [--deps DIR] [--build-dir DIR] [--reps R] [--quick] [--rehearse]
#     --deps DIR       the downloaded packages (default .gpudeps, ignored by git); used where the
#                      machine lacks pkg-config, jansson or Check: unpacked into DIR/prefix,
#                      never into /
#     --build-dir DIR  build tree (default build-gpu)
#     --reps R         timed launches per kernel in the benchmark (default 50)
#     --quick          the benchmark on small shapes only
#     --rehearse       a machine without a GPU: the packages are the only source of jansson and
#                      Check (pkg-config sees nothing else), the CPU tests must pass and the CUDA
#                      tests must report that no device is present (CTest gpucheck_rehearsal
#                      runs this in a network namespace of its own)
# It prints the GPU, driver, CUDA and NCCL versions first. NCCL comes from the CUDA toolkit, or
# from the Python environment's NCCL package (nvidia-nccl-*); none is a failure. On a GPU machine
# a test that reports SKIPPED, or a benchmark that finds no device, is a failure. CUDA
# architectures: this machine's GPU (native), or SN_CUDA_ARCHS. Exit status: 0 all passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

deps=.gpudeps
dir=build-gpu
reps=50
quick=()
fetch=0
rehearse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fetch) fetch=1 ;;
    --deps) deps=$2; shift ;;
    --build-dir) dir=$2; shift ;;
    --reps) reps=$2; shift ;;
    --quick) quick=(--quick) ;;
    --rehearse) rehearse=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
# what the build and tests need beyond a compiler, CMake and CUDA (Debian 12, amd64)
packages=(libjansson-dev libjansson4 check libsubunit-dev libsubunit0 pkgconf pkgconf-bin
          libpkgconf3)

if [ "$fetch" = 1 ]; then
  mkdir -p "$deps"
  (cd "$deps" && apt-get download "${packages[@]}") >"$deps.fetch.log" 2>&1 ||
    { cat "$deps.fetch.log"; echo "gpu-check.sh: apt-get download failed" >&2; exit 1; }
  echo "gpu-check.sh: $(ls "$deps"/*.deb | wc -l) packages in $deps ($(du -sh "$deps" | cut -f1))"
  exit 0
fi

t0=$(date +%s)
say() { echo "gpu-check: $*"; }
fail() { echo "gpu-check: FAILED: $*" >&2; exit 1; }

# ---- what this machine has -------------------------------------------------------------------
# nvcc as CMake finds it: CUDACXX, else the toolkit at /usr/local/cuda, else PATH. The toolkit's
# root is the first of CUDA_HOME, CUDA_PATH, nvcc's own directory (links resolved) and
# /usr/local/cuda that holds cuda_runtime.h: an nvcc on PATH may be a wrapper script elsewhere.
if [ -n "${CUDACXX:-}" ]; then nvcc=$CUDACXX
elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc
else nvcc=$(command -v nvcc || true)
fi
[ -n "$nvcc" ] && [ -x "$nvcc" ] || fail "no nvcc (set CUDACXX)"
cuda_root=""
for r in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(dirname "$(dirname "$(readlink -f "$nvcc")")")" \
         /usr/local/cuda; do
  [ -n "$r" ] && [ -f "$r/include/cuda_runtime.h" ] && { cuda_root=$(cd "$r" && pwd); break; }
done
[ -n "$cuda_root" ] || fail "no CUDA toolkit beside $nvcc (set CUDA_HOME)"
export CUDACXX=$nvcc
if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
else
  say "GPU: none (nvidia-smi finds no device)"
  [ "$rehearse" = 1 ] || fail "no GPU on this machine (--rehearse to rehearse without one)"
fi
say "CUDA: $("$nvcc" --version | grep -o 'release [0-9.]*' | head -n 1) ($cuda_root)"
nccl_header=""
for inc in "$cuda_root/include" "${NCCL_HOME:-/nonexistent}/include" /usr/include; do
  [ -f "$inc/nccl.h" ] && { nccl_header=$inc/nccl.h; break; }
done
if [ -z "$nccl_header" ]; then # NCCL inside the Python environment (PyTorch's wheels)
  py=$(command -v python3 || true)
  pynccl=$([ -n "$py" ] && "$py" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  if [ -n "$pynccl" ] && [ -f "$pynccl/include/nccl.h" ]; then
    export NCCL_HOME=$pynccl
    export LD_LIBRARY_PATH=$pynccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nccl_header=$pynccl/include/nccl.h
  fi
fi
[ -n "$nccl_header" ] || fail "no NCCL: neither in the CUDA toolkit nor in python3's nvidia-nccl package (set NCCL_HOME)"
nccl_version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl_header")
say "NCCL: $nccl_version ($(dirname "$(dirname "$nccl_header")"))"

# ---- jansson, Check and pkg-config: the machine's, or the carried packages ----------------------
cmake_extra=()
if [ "$rehearse" = 1 ] || ! command -v pkg-config >/dev/null ||
   ! pkg-config --exists jansson check 2>/dev/null; then
  prefix=$(mkdir -p "$deps/prefix" && cd "$deps/prefix" && pwd)
  ls "$deps"/*.deb >/dev/null 2>&1 ||
    fail "jansson, Check or pkg-config missing, and no packages in $deps (scripts/gpu-check.sh --fetch, where Debian's registry is reached, and carry $deps)"
  for deb in "$deps"/*.deb; do # ar and tar: no dpkg needed
    work=$(mktemp -d)
    (cd "$work" && ar x "$(cd "$root" && realpath "$deb")" && tar -xf data.tar.* -C "$prefix") ||
      fail "cannot unpack $deb"
    rm -rf "$work"
  done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  for pc in "$lib"/pkgconfig/*.pc; do sed -i "s|^prefix=/usr$|prefix=$prefix/usr|" "$pc"; done
  export PATH=$prefix/usr/bin:$PATH
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig # only these: not the system's
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_extra+=(-DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf")
  say "jansson $(pkgconf --modversion jansson), Check $(pkgconf --modversion check): unpacked into $prefix"
else
  say "jansson $(pkg-config --modversion jansson), Check $(pkg-config --modversion check): this machine's"
fi

# ---- configure and build ---------------------------------------------------------------------
archs=${SN_CUDA_ARCHS:-native}
[ "$rehearse" = 1 ] && archs=${SN_CUDA_ARCHS:-90} # no GPU to ask
say "configure and build ($dir, CUDA architectures $archs)"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSN_WITH_CUDA=ON -DSN_WITH_NCCL=ON \
  -DSN_WITH_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES="$archs" -DSN_BUILD_EXAMPLES=OFF \
  -DSN_TEST_TORCH=OFF -DSN_BENCH_WITH_DNNL=OFF "${cmake_extra[@]}" >"$dir.configure.log" 2>&1 ||
  { tail -n 30 "$dir.configure.log"; fail "configure (whole log: $dir.configure.log)"; }
cpu_tests=(test_status test_comm_callback test_checkpoint test_cuda_args)
cuda_tests=(test_cuda_rownorm test_cuda_batchnorm test_cuda_groupnorm test_cuda_syncbn)
cmake --build "$dir" -j"$(nproc)" --target syncnorm syncnorm_cuda bench_cuda "${cpu_tests[@]}" \
  "${cuda_tests[@]}" >"$dir.build.log" 2>&1 ||
  { tail -n 40 "$dir.build.log"; fail "build (whole log: $dir.build.log)"; }
say "built in $(($(date +%s) - t0)) s"

# ---- tests ---------------------------------------------------------------------------------
results=()
failed=0
run_test() { # name, exe: runs it, records passed / SKIPPED / FAILED
  local t=$1 exe=$2 s rc secs summary
  s=$(date +%s.%N)
  timeout 600 "$exe" >"$dir/$t.log" 2>&1
  rc=$?
  secs=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  summary=$(grep -E "^[0-9]+%: Checks" "$dir/$t.log" | tail -n 1)
  case $rc in
    0) results+=("$t | passed | $summary | ${secs} s") ;;
    77) if [ "$rehearse" = 1 ]; then
          results+=("$t | no device (rehearsal: expected) | $(grep -m1 -o 'SKIPPED.*' "$dir/$t.log") | ${secs} s")
        else
          results+=("$t | FAILED: SKIPPED on a GPU machine | $(grep -m1 -o 'SKIPPED.*' "$dir/$t.log") | ${secs} s")
          failed=1
        fi ;;
    *) results+=("$t | FAILED (exit $rc) | $summary | ${secs} s"); failed=1
       grep -E ":[EF]:" "$dir/$t.log" | head -n 20 ;;
  esac
}
say "tests"
for t in "${cpu_tests[@]}"; do
  exe=$(find "$dir/tests" -maxdepth 2 -type f -name "$t" | head -n 1)
  [ -n "$exe" ] && run_test "$t" "$exe" || { results+=("$t | FAILED: not built | | "); failed=1; }
done
for t in "${cuda_tests[@]}"; do
  if [ "$rehearse" = 1 ]; then # each must say that no device is present, and exit 77
    run_test "$t" "$dir/tests/cuda/$t"
    grep -q "SKIPPED" "$dir/$t.log" || { results+=("$t | FAILED: no SKIPPED line without a GPU | | "); failed=1; }
  else
    run_test "$t" "$dir/tests/cuda/$t"
  fi
done

# ---- benchmark ------------------------------------------------------------------------------
say "CUDA benchmark"
"$dir/bench/bench_cuda" --reps "$reps" "${quick[@]}" >"$dir/bench_cuda.log" 2>&1
rc=$?
cat "$dir/bench_cuda.log"
if [ "$rehearse" = 1 ]; then
  [ $rc -eq 77 ] || { results+=("bench_cuda | FAILED: exit $rc without a GPU (77 expected) | |"); failed=1; }
elif [ $rc -ne 0 ]; then
  results+=("bench_cuda | FAILED (exit $rc) | |")
  failed=1
fi

echo "== gpu-check summary ($(($(date +%s) - t0)) s) =="
echo "| test | result | checks | time |"
echo "|---|---|---|---|"
printf '| %s |\n' "${results[@]}"
grep -E "^(device|copy)" "$dir/bench_cuda.log"
sed -n '/^kernel /,$p' "$dir/bench_cuda.log"
[ $failed = 0 ] && echo "gpu-check: all passed" || echo "gpu-check: FAILED"
exit $failed
