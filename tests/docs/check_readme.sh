#!/usr/bin/env bash
# The README's commands and quick starts are the ones that work:
#  - its first screen (40 lines) names the two commands, scripts/run.sh and scripts/test.sh,
#    which exist and parse, and .ci/run runs the test command;
#  - the C quick start (the ```c block after <!-- quickstart-c -->) compiles with plain cc
#    against this build's libsyncnorm, with no MPI or CUDA flag, and runs;
#  - the Python quick start (after <!-- quickstart-python -->) runs with /usr/bin/python3, in
#    one process, with the package from python/ and this build's libraries.
#   check_readme.sh SOURCE_DIR BUILD_DIR WORK_DIR
# CTest test readme_quickstarts (label docs).
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$3
rm -rf "$work"
mkdir -p "$work"
readme=$src/README.md
die() { echo "check_readme: $*" >&2; exit 1; }

head -n 40 "$readme" >"$work/first-screen"
for cmd in scripts/run.sh scripts/test.sh; do
  grep -q "^$cmd " "$work/first-screen" || die "the first 40 lines do not show '$cmd'"
  [ -f "$src/$cmd" ] || die "$cmd does not exist"
  bash -n "$src/$cmd" || die "$cmd does not parse"
done
grep -q 'scripts/test.sh' "$src/.ci/run" || die ".ci/run does not run scripts/test.sh"
echo "first screen: scripts/run.sh, scripts/test.sh; .ci/run runs scripts/test.sh"

# the fenced block of the given language after the marker line
block() {
  awk -v marker="<!-- $1 -->" -v fence="\`\`\`$2" '
    $0 == marker { armed = 1; next }
    armed && $0 == fence { inside = 1; next }
    inside && $0 == "```" { exit }
    inside { print }' "$readme"
}

block quickstart-c c >"$work/quickstart.c"
[ -s "$work/quickstart.c" ] || die "no C quick start after <!-- quickstart-c -->"
"${CC:-cc}" -std=c11 -Wall -Werror -o "$work/quickstart" "$work/quickstart.c" \
  -I"$src/include" -I"$build/include" -L"$build" -Wl,-rpath,"$build" -lsyncnorm
(cd "$work" && ./quickstart) | tee "$work/c.out"
grep -q "num_batches_tracked 1" "$work/c.out" || die "the C quick start printed something else"
[ -f "$work/quickstart.safetensors" ] || die "the C quick start wrote no checkpoint"

block quickstart-python python >"$work/quickstart.py"
[ -s "$work/quickstart.py" ] || die "no Python quick start after <!-- quickstart-python -->"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$work" && env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE MASTER_PORT="$port" \
  PYTHONPATH="$src/python" SYNCNORM_LIBRARY_DIR="$build" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 quickstart.py) | tee "$work/py.out"
grep -q "^0 tensor" "$work/py.out" || die "the Python quick start printed something else"
echo "readme: ok"
