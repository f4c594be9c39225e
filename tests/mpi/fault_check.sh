#!/usr/bin/env bash
# fault_check.sh — a rank that dies or hangs during SyncBatchNorm's collectives must end the whole
# mpirun job with a non-zero exit, in bounded time, never a hang. Drives fault_inject_mpi (see
# its header for the faults) and measures the time from the fault to the failure's detection and
# to the end of the job.
#
# Usage: fault_check.sh MODE NP FAULT_EXE MPIRUN [MPIRUN_ARGS...]
#   MODE kill      rank NP-1 raises SIGKILL inside its 41st all-reduce (step 10), then before one,
#                  then exits without MPI_Finalize: Open MPI's own detection ends the job.
#   MODE hang      rank 1 hangs inside its 41st all-reduce, then (second run) stops calling: the
#                  others fail with SN_ERR_TIMEOUT after HANG_TIMEOUT_S (the library's
#                  communicator timeout) and abort the job.
#   MODE external  EXTERNAL_RUNS runs of a loop of steps; after a random delay the driver kills a
#                  random rank with SIGKILL from outside (whatever it is doing at that moment).
# Every run is bounded by RUN_LIMIT_S (timeout(1)); a run that reaches it is a hang: FAIL.
# Prints one "RESULT ..." line per run (figures for docs/RELIABILITY.md). Exit 0 if every bound
# held. Environment: SEED (external mode's random delays; default 1).
set -u

# Open MPI's failure detection: mpirun notices a dead rank (SIGCHLD) and kills the others; the
# issue's bound for "the job ends" is 30 s (measured ~1 s on an idle 2-core machine).
KILL_BOUND_S=30
# The communicator timeout the hang runs use: short, so the test is quick, yet far above a
# step's duration on a loaded 2-core machine with 4 oversubscribed ranks (~1 ms, spikes ~100 ms).
HANG_TIMEOUT_S=3
# From the hang to the end of the job: the timeout, the survivors' 2 s report grace
# (ABORT_GRACE_S in fault_inject_mpi.c) and MPI_Abort's teardown, with margin for a loaded host.
HANG_BOUND_S=30
# Detection itself must come close to the timeout: not before it (that would be a false
# positive), not much after it (polling granularity is 100 µs; the margin covers scheduling).
HANG_DETECT_SLACK_S=5
# A hard limit per mpirun run: reaching it means the job hung.
RUN_LIMIT_S=120
EXTERNAL_RUNS=${EXTERNAL_RUNS:-5}

if [ $# -lt 4 ]; then
  echo "usage: $0 kill|hang|external NP FAULT_EXE MPIRUN [ARGS...]" >&2
  exit 2
fi
MODE=$1 NP=$2 EXE=$3
shift 3
MPIRUN=("$@")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sn-faults.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILS=0

now() { date +%s.%N; }
# fsub A B: A - B with 3 decimals
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
# fle A B: A <= B
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

# Kills what a run left behind (only processes it started: their pids are in its log).
# A rank still alive (not a zombie) 1 s after mpirun returned would be an orphan: FAIL.
reap() {
  local log=$1 p
  sleep 1
  for p in $(sed -n 's/^PID rank=[0-9]* pid=\([0-9]*\)$/\1/p' "$log"); do
    if grep -qs "$(basename "$EXE")" "/proc/$p/cmdline" &&
       ! grep -qs '^State:.*Z' "/proc/$p/status"; then
      kill -9 "$p" 2>/dev/null
      fail "rank pid $p outlived mpirun (killed now)"
    fi
  done
}

# run NAME ARGS... — one bounded mpirun; sets RC, T_START, T_END, LOG.
run() {
  local name=$1
  shift
  LOG=$WORK/$name.log
  T_START=$(now)
  timeout -k 5 "$RUN_LIMIT_S" "${MPIRUN[@]}" -np "$NP" "$EXE" "$@" </dev/null >"$LOG" 2>&1
  RC=$?
  T_END=$(now)
  reap "$LOG"
  if fle "$RUN_LIMIT_S" "$(fsub "$T_END" "$T_START")"; then
    fail "$name: still running after ${RUN_LIMIT_S} s (timeout(1) ended it): a hang"
  fi
}

fault_time() { sed -n 's/^FAULT .* t=\([0-9.]*\)$/\1/p' "$LOG" | head -1; }

check_killed() {
  local name=$1 ft
  ft=$(fault_time)
  if [ -z "$ft" ]; then
    fail "$name: the fault was not injected"; cat "$LOG"; return
  fi
  local end_s; end_s=$(fsub "$T_END" "$ft")
  echo "RESULT mode=kill fault=$name np=$NP rc=$RC fault_to_job_end_s=$end_s run_s=$(fsub "$T_END" "$T_START")"
  [ "$RC" -ne 0 ] || fail "$name: mpirun exited 0 after a rank died"
  fle "$end_s" "$KILL_BOUND_S" || fail "$name: the job ended ${end_s} s after the fault (bound ${KILL_BOUND_S} s)"
  grep -q '^DONE' "$LOG" && fail "$name: a rank finished its loop although another died"
  grep -E -q "exited on signal 9|exited with non-zero status|non-zero exit code|MPI_ABORT" "$LOG" ||
    fail "$name: no Open MPI report of the failure in the output"
}

case "$MODE" in
kill)
  for f in kill-inside kill-before exit-before; do
    run "$f" --fault "$f" --rank $((NP - 1)) --at 41 --steps 1000000 --max-s 100
    check_killed "$f"
  done
  ;;
hang)
  for f in hang-inside hang-before; do
    run "$f" --fault "$f" --rank 1 --at 41 --steps 1000000 --max-s 100 --timeout "$HANG_TIMEOUT_S"
    ft=$(fault_time)
    if [ -z "$ft" ]; then fail "$f: the fault was not injected"; cat "$LOG"; continue; fi
    end_s=$(fsub "$T_END" "$ft")
    n=$(grep -c '^DETECTED .*status=SN_ERR_TIMEOUT' "$LOG")
    other=$(grep '^DETECTED' "$LOG" | grep -vc 'status=SN_ERR_TIMEOUT')
    first=$(sed -n 's/^DETECTED .* t=\([0-9.]*\) msg=.*/\1/p' "$LOG" | sort -n | head -1)
    last=$(sed -n 's/^DETECTED .* t=\([0-9.]*\) msg=.*/\1/p' "$LOG" | sort -n | tail -1)
    det_first=$( [ -n "$first" ] && fsub "$first" "$ft" || echo NA)
    det_last=$( [ -n "$last" ] && fsub "$last" "$ft" || echo NA)
    echo "RESULT mode=hang fault=$f np=$NP timeout_s=$HANG_TIMEOUT_S rc=$RC survivors_timed_out=$n/$((NP - 1)) fault_to_first_detection_s=$det_first fault_to_last_detection_s=$det_last fault_to_job_end_s=$end_s"
    [ "$RC" -ne 0 ] || fail "$f: mpirun exited 0 with a hung rank"
    [ "$n" -eq $((NP - 1)) ] || { fail "$f: $n of $((NP - 1)) survivors reported SN_ERR_TIMEOUT"; cat "$LOG"; }
    [ "$other" -eq 0 ] || fail "$f: a survivor reported another status"
    grep -q "waited ${HANG_TIMEOUT_S}.0 s for the other ranks" "$LOG" || fail "$f: the timeout message is missing"
    for w in $(sed -n 's/^DETECTED .* waited=\([0-9.]*\) .*/\1/p' "$LOG"); do
      fle "$HANG_TIMEOUT_S" "$w" || fail "$f: a survivor gave up after $w s, before the timeout"
    done
    if [ -n "$first" ]; then
      fle "$det_last" "$((HANG_TIMEOUT_S + HANG_DETECT_SLACK_S))" ||
        fail "$f: detection ${det_last} s after the hang (timeout ${HANG_TIMEOUT_S} s + ${HANG_DETECT_SLACK_S} s)"
    fi
    fle "$end_s" "$HANG_BOUND_S" || fail "$f: the job ended ${end_s} s after the hang (bound ${HANG_BOUND_S} s)"
  done
  ;;
external)
  RANDOM=${SEED:-1}
  for i in $(seq 1 "$EXTERNAL_RUNS"); do
    victim=$((RANDOM % NP))
    delay_ms=$((300 + RANDOM % 2000))
    piddir=$WORK/pids$i
    mkdir -p "$piddir"
    LOG=$WORK/external$i.log
    T_START=$(now)
    timeout -k 5 "$RUN_LIMIT_S" "${MPIRUN[@]}" -np "$NP" "$EXE" --steps 0 --max-s 60 \
      --pid-dir "$piddir" </dev/null >"$LOG" 2>&1 &
    job=$!
    # wait for every rank's pid file (bounded), then for the random delay
    for _ in $(seq 1 200); do [ "$(ls "$piddir" | wc -l)" -ge "$NP" ] && break; sleep 0.1; done
    sleep "$(awk -v m="$delay_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
    pid=$(cat "$piddir/rank$victim.pid" 2>/dev/null)
    tk=$(now)
    if [ -z "$pid" ] || ! kill -9 "$pid" 2>/dev/null; then
      fail "external $i: rank $victim (pid '${pid}') was not running to be killed"
    fi
    wait "$job"
    RC=$?
    T_END=$(now)
    reap "$LOG"
    end_s=$(fsub "$T_END" "$tk")
    steps_note=$(grep -c '^DONE' "$LOG")
    echo "RESULT mode=external run=$i np=$NP victim_rank=$victim delay_ms=$delay_ms rc=$RC kill_to_job_end_s=$end_s"
    [ "$RC" -ne 0 ] || fail "external $i: mpirun exited 0 after rank $victim was killed"
    [ "$steps_note" -eq 0 ] || fail "external $i: a rank finished normally"
    fle "$end_s" "$KILL_BOUND_S" || fail "external $i: the job ended ${end_s} s after the kill (bound ${KILL_BOUND_S} s)"
  done
  ;;
*)
  echo "unknown mode $MODE" >&2
  exit 2
  ;;
esac

if [ "$FAILS" -ne 0 ]; then
  echo "fault_check $MODE np=$NP: $FAILS failure(s)"
  exit 1
fi
echo "fault_check $MODE np=$NP: every fault ended the job with a non-zero exit within its bound"
