#!/usr/bin/env bash
# multihost-check.sh — SyncBatchNorm across two "hosts" on one machine: two network namespaces
# joined by a veth pair, Open MPI over TCP between them, then the link cut in the middle of a run.
#
# What it does (root, Linux with `ip netns`; otherwise it prints why and exits 77 = skipped):
#  1. creates network namespaces sn-mh-<pid>-a and -b ("hostA", "hostB"), a veth pair between
#     them with 10.77.0.1/24 (A) and 10.77.0.2/24 (B). These addresses exist only inside the two
#     namespaces; nothing is sent anywhere else. Each launched process also gets its own UTS
#     namespace with hostname hostA or hostB, so Open MPI sees two nodes.
#  2. writes a hostfile (hostA slots=2, hostB slots=2) and a launcher agent used instead of ssh
#     (--mca plm_rsh_agent): Open MPI's rsh launcher calls `AGENT HOST COMMAND...`; the agent
#     runs COMMAND (the orted daemon) inside HOST's namespace. mpirun itself runs in hostA's.
#  3. runs, 4 ranks = 2 per host, Open MPI over TCP only (--mca btl tcp,self, btl_tcp_if_include
#     and oob_tcp_if_include 10.77.0.0/24):
#       - test_syncbn_mpi's "equivalence" case (SyncBatchNorm on the split batch = BatchNorm on
#         the whole batch) and syncnorm-statcheck --exact (its fp64 reference);
#       - syncnorm-train --max-steps 100 (needs the Fashion-MNIST files), whose model.safetensors
#         must be byte-identical to the same run on one host (shared memory): the result does
#         not depend on the transport.
#  4. cuts the link (ip link set down in hostB) in the middle of a training run, twice:
#       cut 1: library timeout SN_COMM_TIMEOUT_S=CUT_COMM_TIMEOUT_S plus Open MPI's TCP keepalive;
#       cut 2: library timeout off (SN_COMM_TIMEOUT_S=0): Open MPI's keepalive alone;
#     each must end the job with a non-zero exit within CUT_BOUND_S; the time is measured.
#     Open MPI's out-of-band keepalive is shortened (--mca oob_tcp_keepalive_time 5,
#     oob_tcp_keepalive_intvl 2, oob_tcp_keepalive_probes 3) and so is the kernel's TCP
#     retransmission limit inside the two namespaces only (net.ipv4.tcp_retries2=5, ~13 s):
#     with Open MPI's defaults (300 s + 9 × 20 s keepalive, tcp_retries2 = 15: ~15 min) mpirun
#     waits minutes for the unreachable daemon even after every rank has given up.
#  5. always removes what it created (trap): kills the processes left in the two namespaces
#     (only ours: the namespaces are ours) and deletes the namespaces (which deletes the veth).
#
# Usage: scripts/multihost-check.sh [--build DIR] [--data DIR] [--keep-logs DIR] [--defaults-demo]
#   --build DIR  build tree with tests/mpi/test_syncbn_mpi, syncnorm-statcheck and
#                examples/syncnorm-train [build]
#   --data DIR   Fashion-MNIST IDX files [/usr/share/datasets/fashion-mnist]; without them the
#                training runs are skipped and the cuts use tests/mpi/fault_inject_mpi instead
#   --keep-logs DIR  copy every run's output there
#   --defaults-demo  then also cut the link with Open MPI's and the kernel's default TCP timeouts
#                (keepalive 300 s, tcp_retries2 15) and SN_COMM_TIMEOUT_S=10, to show why the
#                shortened ones matter: mpirun is expected to hang until DEMO_LIMIT_S, when it is
#                killed (reported, not a failure; takes DEMO_LIMIT_S)
# Exit status: 0 pass, 1 a check failed, 2 usage, 77 skipped (not root, no `ip netns`, ...).
# Prints "RESULT ..." lines with the figures (docs/RELIABILITY.md, "Across hosts").
set -u

# ---- bounds (each with its reason) -------------------------------------------------------------
# The library's communicator timeout in cut 1: well above a training step (~20 ms over TCP on a
# loaded 2-core machine), short enough for a quick test.
CUT_COMM_TIMEOUT_S=10
# From the cut to the end of mpirun: the larger of the library timeout (10 s) and Open MPI's
# shortened keepalive (5 + 2 × 3 = 11 s), plus MPI_Abort's teardown and a loaded machine.
CUT_BOUND_S=60
# Hard limit per mpirun run (timeout(1)): a run that reaches it hung.
RUN_LIMIT_S=300
# Wait for this many metrics.csv rows (--log-every 10: 10 steps each) before cutting: mid-run.
CUT_AFTER_ROWS=2
# --defaults-demo: how long to let mpirun hang before killing it.
DEMO_LIMIT_S=300

BUILD=build
DATA=/usr/share/datasets/fashion-mnist
KEEP=""
DEMO=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --keep-logs) KEEP=$2; shift 2 ;;
    --defaults-demo) DEMO=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 0 ;;
    *) echo "multihost-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "multihost-check: no build directory" >&2; exit 2; }

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
for tool in ip unshare mpirun timeout; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed"
done
EQUIV=$BUILD/tests/mpi/test_syncbn_mpi
STATCHECK=$BUILD/syncnorm-statcheck
TRAIN=$BUILD/examples/syncnorm-train
FAULT=$BUILD/tests/mpi/fault_inject_mpi
[ -x "$EQUIV" ] || skip "$EQUIV is not built"
HAVE_TRAIN=1
if [ ! -x "$TRAIN" ] || [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  HAVE_TRAIN=0
  echo "note: syncnorm-train or the Fashion-MNIST files are missing: no training runs; the cuts use fault_inject_mpi"
  [ -x "$FAULT" ] || skip "neither syncnorm-train with data nor $FAULT is available"
fi

NS_A=sn-mh-$$-a NS_B=sn-mh-$$-b
VETH_A=snmh$$a VETH_B=snmh$$b
ADDR_A=10.77.0.1 ADDR_B=10.77.0.2 NET=10.77.0.0/24
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sn-multihost.XXXXXX")
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
now() { date +%s.%N; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# Kills every process still inside our namespaces (returns how many there were).
kill_ns_procs() {
  local n=0 ns p
  for ns in "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      kill -9 "$p" 2>/dev/null && n=$((n + 1))
    done
  done
  echo "$n"
}

cleanup() {
  kill_ns_procs >/dev/null
  sleep 0.2
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "$VETH_A" 2>/dev/null # only if it never moved into a namespace
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$WORK"/. "$KEEP"/; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. the two hosts ----------------------------------------------------------------------------
ip netns add "$NS_A" 2>"$WORK/netns.err" || skip "cannot create a network namespace: $(cat "$WORK/netns.err")"
ip netns add "$NS_B" || skip "cannot create a second network namespace"
ip link add "$VETH_A" type veth peer name "$VETH_B" 2>"$WORK/veth.err" ||
  skip "cannot create a veth pair: $(cat "$WORK/veth.err")"
ip link set "$VETH_A" netns "$NS_A" && ip link set "$VETH_B" netns "$NS_B" &&
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A" && ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VETH_B" &&
  ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
  ip -n "$NS_A" link set "$VETH_A" up && ip -n "$NS_B" link set "$VETH_B" up ||
  skip "cannot configure the veth pair"
# the kernel's TCP retransmission limit, inside our namespaces only (see the header)
for ns in "$NS_A" "$NS_B"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5 || true; done
echo "hosts: hostA = netns $NS_A ($ADDR_A on $VETH_A), hostB = netns $NS_B ($ADDR_B on $VETH_B)"

# ---- 2. hostfile and launcher agent ------------------------------------------------------------
HOSTFILE=$WORK/hostfile
printf 'hostA slots=2\nhostB slots=2\n' >"$HOSTFILE"
AGENT=$WORK/netns-agent.sh
cat >"$AGENT" <<EOF
#!/bin/sh
# Launcher agent for Open MPI's rsh launcher (--mca plm_rsh_agent): called as
# AGENT [OPTIONS] HOST COMMAND..., like ssh; runs COMMAND (joined, as ssh does) in HOST's
# network namespace, with HOST as hostname in a UTS namespace of its own.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case "\$host" in
  hostA) ns=$NS_A ;;
  hostB) ns=$NS_B ;;
  *) echo "netns-agent: unknown host '\$host'" >&2; exit 1 ;;
esac
echo "netns-agent: \$host -> \$ns: \$*" >>"$WORK/agent.log"
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
chmod +x "$AGENT"

MPI_COMMON=(--allow-run-as-root --oversubscribe --bind-to none --hostfile "$HOSTFILE"
  --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1
  --mca btl tcp,self --mca btl_tcp_if_include "$NET" --mca oob_tcp_if_include "$NET"
  --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3
  --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 -np 4)
MPI_CUT=("${MPI_COMMON[@]}") # what cut_link runs with

# on_hosts NAME ENV... -- CMD... : mpirun in hostA's namespace; sets RC, LOG, T0, T1
on_hosts() {
  local name=$1 envs=()
  shift
  while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done
  shift
  LOG=$WORK/$name.log
  T0=$(now)
  timeout -k 10 "$RUN_LIMIT_S" ip netns exec "$NS_A" unshare --uts \
    sh -c 'hostname hostA && exec "$@"' sh mpirun "${MPI_COMMON[@]}" "${envs[@]}" "$@" \
    </dev/null >"$LOG" 2>&1
  RC=$?
  T1=$(now)
  fle "$RUN_LIMIT_S" "$(fsub "$T1" "$T0")" && fail "$name: still running after ${RUN_LIMIT_S} s: a hang"
  local left; left=$(kill_ns_procs)
  [ "$left" -eq 0 ] || echo "note: $name: $left process(es) were left in the namespaces and are killed"
}

# ---- 3. runs across the hosts ------------------------------------------------------------------
on_hosts equivalence CK_RUN_CASE=equivalence -- "$EQUIV"
placement=$(grep -c . "$WORK/agent.log" 2>/dev/null || echo 0)
echo "RESULT multihost=equivalence np=4 hosts=2 rc=$RC seconds=$(fsub "$T1" "$T0") $(grep -o '[0-9]*%: Checks: [0-9]*, Failures: [0-9]*, Errors: [0-9]*' "$LOG")"
[ "$RC" -eq 0 ] && grep -q '100%: Checks' "$LOG" || { fail "equivalence test across hosts"; tail -30 "$LOG"; }
[ "$placement" -ge 1 ] || fail "the agent never launched a daemon on hostB: not a two-host run"

if [ -x "$STATCHECK" ]; then
  on_hosts statcheck -- "$STATCHECK" --exact --channels 3 --spatial 5 --steps 8 --momentum none
  echo "RESULT multihost=statcheck_exact np=4 hosts=2 rc=$RC seconds=$(fsub "$T1" "$T0") $(grep -E '^(PASS|FAIL)' "$LOG")"
  [ "$RC" -eq 0 ] && grep -q '^PASS' "$LOG" || { fail "statcheck --exact across hosts"; tail -20 "$LOG"; }
fi

TRAIN_ARGS=(--data "$DATA" --epochs 1 --train-subset 1600 --test-subset 200 --batch 4 --threads 1
  --seed 3 --log-every 10)
if [ "$HAVE_TRAIN" -eq 1 ]; then
  on_hosts train -- "$TRAIN" "${TRAIN_ARGS[@]}" --max-steps 100 --out "$WORK/train2"
  echo "RESULT multihost=train np=4 hosts=2 rc=$RC seconds=$(fsub "$T1" "$T0") $(grep -o 'test accuracy [0-9.]*% after [0-9]* steps' "$LOG"), $(grep -o '[0-9.]* ms/step' "$LOG")"
  [ "$RC" -eq 0 ] && grep -q 'bitwise identical on all 4 ranks: yes' "$LOG" ||
    { fail "training across hosts"; tail -20 "$LOG"; }
  # the same run on one host, over shared memory: Open MPI picks its reduction algorithm from the
  # communicator and message sizes, not the transport, so the result is the same byte for byte
  timeout -k 10 "$RUN_LIMIT_S" mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 -np 4 "$TRAIN" "${TRAIN_ARGS[@]}" \
    --max-steps 100 --out "$WORK/train1" </dev/null >"$WORK/train1.log" 2>&1
  if cmp -s "$WORK/train1/model.safetensors" "$WORK/train2/model.safetensors"; then
    echo "RESULT multihost=train_vs_one_host model.safetensors byte-identical"
  else
    fail "model.safetensors of the two-host run differs from the one-host run"
  fi
fi

# ---- 4. cut the link mid-run ---------------------------------------------------------------------
# cut_link NAME COMM_TIMEOUT : starts a long run, cuts hostB's link once it is well under way, and
# measures the time from the cut to the end of mpirun.
cut_link() {
  local name=$1 tmo=$2 out=$WORK/$1 cmd
  mkdir -p "$out"
  if [ "$HAVE_TRAIN" -eq 1 ]; then
    cmd=("$TRAIN" "${TRAIN_ARGS[@]}" --train-subset 40000 --max-steps 2400 --out "$out")
  else
    cmd=("$FAULT" --steps 0 --max-s 200)
  fi
  LOG=$WORK/$name.log
  local t0; t0=$(now)
  timeout -k 10 "$RUN_LIMIT_S" ip netns exec "$NS_A" unshare --uts \
    sh -c 'hostname hostA && exec "$@"' sh mpirun "${MPI_CUT[@]}" -x SN_COMM_TIMEOUT_S="$tmo" \
    "${cmd[@]}" </dev/null >"$LOG" 2>&1 &
  local job=$! i ready=0 rows
  for i in $(seq 1 1200); do # ≤ 120 s for start-up and the first steps
    if [ "$HAVE_TRAIN" -eq 1 ]; then
      rows=$(grep -c '^train,' "$out/metrics.csv" 2>/dev/null)
      [ "${rows:-0}" -ge "$CUT_AFTER_ROWS" ] && ready=1
    else
      [ "$(grep -c '^PID' "$LOG")" -ge 4 ] && sleep 2 && ready=1
    fi
    [ "$ready" -eq 1 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  [ "$ready" -eq 1 ] || { fail "$name: the run never got under way"; tail -20 "$LOG"; }
  local tc; tc=$(now)
  ip -n "$NS_B" link set "$VETH_B" down
  wait "$job"
  RC=$?
  local te; te=$(now)
  local secs; secs=$(fsub "$te" "$tc")
  local steps; steps=$(tail -1 "$out/metrics.csv" 2>/dev/null | cut -d, -f3)
  local timeouts; timeouts=$(grep -c 'SN_ERR_TIMEOUT' "$LOG")
  local lost; lost=$(grep -c 'lost communication with a remote daemon' "$LOG")
  sleep 3 # the daemons' lifeline: what is still alive 3 s later is left behind
  local left; left=$(kill_ns_procs)
  echo "RESULT multihost=$name SN_COMM_TIMEOUT_S=$tmo cut_after_step=${steps:-?} rc=$RC cut_to_job_end_s=$secs ranks_reporting_SN_ERR_TIMEOUT=$timeouts open_mpi_lost_daemon_reports=$lost processes_left_after_3s=$left"
  [ "$RC" -ne 0 ] || fail "$name: mpirun exited 0 after the link was cut"
  fle "$secs" "$CUT_BOUND_S" || fail "$name: the job ended $secs s after the cut (bound $CUT_BOUND_S s)"
  ip -n "$NS_B" link set "$VETH_B" up
}
cut_link cut_with_comm_timeout "$CUT_COMM_TIMEOUT_S"
cut_link cut_open_mpi_only 0

if [ "$DEMO" -eq 1 ]; then
  MPI_CUT=()
  for a in "${MPI_COMMON[@]}"; do # drop the keepalive settings (each "--mca name value")
    case "$a" in oob_tcp_keepalive_*) unset 'MPI_CUT[${#MPI_CUT[@]}-1]'; skipv=1; continue ;; esac
    [ "${skipv:-0}" -eq 1 ] && { skipv=0; continue; }
    MPI_CUT+=("$a")
  done
  for ns in "$NS_A" "$NS_B"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=15 || true; done
  saved_fails=$FAILS saved_limit=$RUN_LIMIT_S saved_bound=$CUT_BOUND_S
  RUN_LIMIT_S=$DEMO_LIMIT_S CUT_BOUND_S=$DEMO_LIMIT_S
  cut_link cut_with_default_tcp_timeouts "$CUT_COMM_TIMEOUT_S"
  echo "RESULT multihost=cut_with_default_tcp_timeouts: a cut_to_job_end_s near ${DEMO_LIMIT_S} (rc 124/137) means mpirun hung until timeout(1) killed it"
  FAILS=$saved_fails RUN_LIMIT_S=$saved_limit CUT_BOUND_S=$saved_bound
fi

if [ "$FAILS" -ne 0 ]; then
  echo "multihost-check: $FAILS failure(s)"
  exit 1
fi
echo "multihost-check: SyncBatchNorm and training across two hosts ok; a cut link ended the job within ${CUT_BOUND_S} s"
