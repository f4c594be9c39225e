#!/usr/bin/env bash
# train_kill_check.sh — syncnorm-train killed with SIGKILL mid-save and during a step: the job
# ends (non-zero exit, bounded time), the checkpoint left on disk is complete (it loads, and it is
# byte for byte the checkpoint the uninterrupted run wrote at that step), and --resume from it
# ends byte-identical (model.safetensors and checkpoint.safetensors) to the uninterrupted run.
#
# Usage: train_kill_check.sh TRAIN DATA_DIR KILLHOOK_SO ST_VERIFY WORK_DIR MPIRUN [ARGS...]
# Exit 0 pass, 1 fail, 77 skipped (Fashion-MNIST not installed).
#
# Kill points (killhook.c, preloaded into the ranks; nothing in the program changes):
#   save of epoch 2's checkpoint.safetensors: half-way through writing its temporary file,
#   before its fsync, before its rename, right after its rename; save of epoch 2's
#   model.safetensors: before / after its rename (the window between the two files); inside a
#   training step's all-reduce on rank 1 (epoch 2) and on rank 0 (epoch 1, before any checkpoint
#   exists); then RANDOM_KILLS kills of a random rank at random moments from outside, each run
#   resuming from whatever the previous one left.
set -u

NP=2
# Run shape: 512 training images, batch 8 per rank, 2 ranks: 32 steps per epoch, 6 epochs (192
# steps, a checkpoint at the end of each epoch); a run takes ~3 s on an idle 2-core machine,
# most of it start-up (reading the data set).
STEPS_PER_EPOCH=32
EPOCHS=6
# Open MPI ends the job when a rank dies; the issue's bound is 30 s.
KILL_BOUND_S=30
# A hard limit per run: reaching it is a hang.
RUN_LIMIT_S=180
# Random kills from outside: how many, and the delay (ms) after training started (rank 0's
# banner): a run trains for ~2 s (6 epochs with their evaluations and saves) on an idle 2-core
# machine, so the kills land in steps, evaluations and saves alike.
RANDOM_KILLS=${RANDOM_KILLS:-8}
DELAY_MIN_MS=0
DELAY_MAX_MS=1500

if [ $# -lt 6 ]; then
  echo "usage: $0 TRAIN DATA_DIR KILLHOOK_SO ST_VERIFY WORK_DIR MPIRUN [ARGS...]" >&2
  exit 2
fi
TRAIN=$1 DATA=$2 HOOK=$3 VERIFY=$4 WORK=$5
shift 5
MPIRUN=("$@")
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "skipped: Fashion-MNIST not found in $DATA (apt-get install dataset-fashion-mnist)"
  exit 77
fi
rm -rf "$WORK"
mkdir -p "$WORK"
# In a sanitizer build the ASan runtime must come first among the preloaded libraries.
ASAN_LIB=$(ldd "$TRAIN" 2>/dev/null | awk '/libasan/ { print $3 }')
PRELOAD=${ASAN_LIB:+$ASAN_LIB:}$HOOK
COMMON=(--data "$DATA" --epochs "$EPOCHS" --train-subset $((STEPS_PER_EPOCH * NP * 8))
        --test-subset 100 --batch 8 --threads 1 --seed 5 --log-every 8)
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
now() { date +%s.%N; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# train NAME OUTDIR [ENV=VAL...] -- ARGS... : one bounded run; sets RC, LOG, T_END.
train() {
  local name=$1 out=$2
  shift 2
  local xs=(-x LD_PRELOAD="$PRELOAD")
  while [ "$1" != "--" ]; do xs+=(-x "$1"); shift; done
  shift
  LOG=$WORK/$name.log
  local t0; t0=$(now)
  timeout -k 5 "$RUN_LIMIT_S" "${MPIRUN[@]}" -np "$NP" "${xs[@]}" "$TRAIN" "${COMMON[@]}" \
    --out "$out" "$@" </dev/null >"$LOG" 2>&1
  RC=$?
  T_END=$(now)
  if fle "$RUN_LIMIT_S" "$(fsub "$T_END" "$t0")"; then fail "$name: hung (${RUN_LIMIT_S} s)"; fi
}

# verify FILE — prints the verifier's line; returns its status
verify() { "$VERIFY" "$1"; }

same() { cmp -s "$1" "$2"; }

# resume_to_end NAME DIR — continues DIR's run from its checkpoint (or from scratch without
# one) to the end; the result must equal the uninterrupted run byte for byte.
resume_to_end() {
  local name=$1 dir=$2 from=()
  [ -f "$dir/checkpoint.safetensors" ] && from=(--resume "$dir/checkpoint.safetensors")
  train "$name.resume" "$dir" -- "${from[@]}"
  if [ "$RC" -ne 0 ]; then fail "$name: the resumed run exited $RC"; tail -5 "$LOG"; return; fi
  local bad=0
  same "$dir/model.safetensors" "$WORK/ref/full/model.safetensors" ||
    { fail "$name: model.safetensors after --resume differs from the uninterrupted run"; bad=1; }
  same "$dir/checkpoint.safetensors" "$WORK/ref/full/checkpoint.safetensors" ||
    { fail "$name: checkpoint.safetensors after --resume differs from the uninterrupted run"; bad=1; }
  [ "$bad" -eq 0 ] || return
  local how="from scratch: no checkpoint"
  [ ${#from[@]} -gt 0 ] && how=$(grep -o 'resumed from .* at step [0-9]*' "$LOG" | sed 's|.*at step|from step|')
  echo "  resumed ($how): final model.safetensors and checkpoint.safetensors byte-identical to the uninterrupted run"
}

# ---- reference runs: uninterrupted, and stopped at the end of epochs 1 and 2 ------------------
mkdir -p "$WORK/ref"
train ref_full "$WORK/ref/full" --
[ "$RC" -eq 0 ] || { fail "uninterrupted run exited $RC"; cat "$LOG"; exit 1; }
for e in 1 2; do
  train "ref_e$e" "$WORK/ref/e$e" -- --max-steps $((e * STEPS_PER_EPOCH))
  [ "$RC" -eq 0 ] || { fail "run to epoch $e exited $RC"; cat "$LOG"; exit 1; }
done
echo "reference: $(grep 'wall time' "$WORK/ref_full.log")"

# ---- kills at exact points ---------------------------------------------------------------------
# name  point:file:nth  rank  expected checkpoint, expected model.safetensors: the reference of
# epoch 1 or 2 (e1/e2), or none. All-reduce counts: a step makes 5 (bn1, bn2 forward and backward,
# the gradients), 9 with check_consistency (the default); an epoch end 2 more. The 300th is in
# epoch 2 and the 100th in epoch 1 either way.
SCENARIOS="
save_ck_mid_write      write:checkpoint.safetensors:2         0 e1 e2
save_ck_before_fsync   fsync:checkpoint.safetensors:2         0 e1 e2
save_ck_before_rename  rename:checkpoint.safetensors:2        0 e1 e2
save_ck_after_rename   after-rename:checkpoint.safetensors:2  0 e2 e2
save_model_before_rename rename:model.safetensors:2           0 e1 e1
save_model_after_rename  after-rename:model.safetensors:2     0 e1 e2
step_epoch2_rank1      allreduce::300                         1 e1 e1
step_epoch1_rank0      allreduce::100                         0 none none
"
while read -r name at rank want_ck want_model; do
  [ -n "$name" ] || continue
  dir=$WORK/$name
  train "$name" "$dir" SN_KILLHOOK_AT="$at" SN_KILLHOOK_RANK="$rank" --
  kt=$(sed -n 's/^KILLHOOK .* t=\([0-9.]*\)$/\1/p' "$LOG" | head -1)
  if [ -z "$kt" ]; then fail "$name: the kill point $at was never reached"; tail -20 "$LOG"; continue; fi
  end_s=$(fsub "$T_END" "$kt")
  ck="$dir/checkpoint.safetensors"
  ckstate=$( [ -f "$ck" ] && verify "$ck" || echo "absent")
  echo "RESULT train_kill=$name at=$at rank=$rank rc=$RC kill_to_job_end_s=$end_s checkpoint: $ckstate"
  [ "$RC" -ne 0 ] || fail "$name: mpirun exited 0 although rank $rank was killed"
  fle "$end_s" "$KILL_BOUND_S" || fail "$name: the job ended $end_s s after the kill (bound $KILL_BOUND_S s)"
  if [ "$want_ck" = none ]; then
    [ ! -f "$ck" ] || fail "$name: a checkpoint exists although none was due"
  else
    verify "$ck" >/dev/null || fail "$name: the checkpoint on disk does not load: $ckstate"
    same "$ck" "$WORK/ref/$want_ck/checkpoint.safetensors" ||
      fail "$name: the checkpoint on disk is not epoch ${want_ck#e}'s"
  fi
  if [ "$want_model" != none ]; then
    verify "$dir/model.safetensors" >/dev/null || fail "$name: model.safetensors does not load"
    same "$dir/model.safetensors" "$WORK/ref/$want_model/model.safetensors" ||
      fail "$name: model.safetensors is not epoch ${want_model#e}'s"
  fi
  for tmp in "$dir"/*.tmp.*; do
    [ -e "$tmp" ] || continue
    echo "  left behind: $(basename "$tmp") ($(stat -c %s "$tmp") bytes): $(verify "$tmp")"
  done
  resume_to_end "$name" "$dir"
done <<<"$SCENARIOS"

# ---- random kills from outside -----------------------------------------------------------------
RANDOM=${SEED:-7}
dir=$WORK/random
mkdir -p "$dir"
chains=1
for i in $(seq 1 "$RANDOM_KILLS"); do
  piddir=$WORK/pids$i
  mkdir -p "$piddir"
  from=()
  [ -f "$dir/checkpoint.safetensors" ] && from=(--resume "$dir/checkpoint.safetensors")
  before=$( [ -f "$dir/checkpoint.safetensors" ] && verify "$dir/checkpoint.safetensors" | sed 's/.*step=//' || echo none)
  LOG=$WORK/random$i.log
  timeout -k 5 "$RUN_LIMIT_S" "${MPIRUN[@]}" -np "$NP" \
    -x LD_PRELOAD="$PRELOAD" -x SN_KILLHOOK_PIDDIR="$piddir" "$TRAIN" "${COMMON[@]}" --out "$dir" "${from[@]}" \
    </dev/null >"$LOG" 2>&1 &
  job=$!
  # the delay counts from the start of training (rank 0's banner, after reading the data)
  for _ in $(seq 1 1200); do
    [ "$(ls "$piddir" | wc -l)" -ge "$NP" ] && grep -q '^syncnorm-train (syncnorm' "$LOG" && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.05
  done
  victim=$((RANDOM % NP))
  delay_ms=$((DELAY_MIN_MS + RANDOM % (DELAY_MAX_MS - DELAY_MIN_MS)))
  sleep "$(awk -v m="$delay_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
  pid=$(cat "$piddir/rank$victim.pid" 2>/dev/null)
  kt=$(now)
  killed=0
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && killed=1
  wait "$job"
  RC=$?
  T_END=$(now)
  last=$(grep -E '^epoch [0-9]+/[0-9]+ +step|epoch [0-9]+/[0-9]+ done' "$LOG" | tail -1 | cut -c1-40)
  [ -n "$last" ] || last="none yet: before this run's first epoch end"
  after=$( [ -f "$dir/checkpoint.safetensors" ] && verify "$dir/checkpoint.safetensors" || echo "absent")
  if [ "$killed" -eq 0 ]; then
    echo "RESULT train_random=$i victim_rank=$victim delay_ms=$delay_ms: the run had already ended (rc=$RC)"
    if [ "$RC" -ne 0 ]; then fail "random $i: the run ended by itself with $RC"; continue; fi
    # the chain of kills and resumes reached the end: it must equal the uninterrupted run;
    # the next kill starts a new chain
    same "$dir/model.safetensors" "$WORK/ref/full/model.safetensors" &&
      same "$dir/checkpoint.safetensors" "$WORK/ref/full/checkpoint.safetensors" ||
      fail "random $i: the chain of resumed runs ended differently from the uninterrupted run"
    echo "  chain $chains complete: byte-identical to the uninterrupted run; a new chain starts"
    chains=$((chains + 1))
    rm -rf "$dir"
    mkdir -p "$dir"
    continue
  fi
  end_s=$(fsub "$T_END" "$kt")
  echo "RESULT train_random=$i victim_rank=$victim delay_ms=$delay_ms rc=$RC kill_to_job_end_s=$end_s checkpoint_before_step=$before after: $after (last progress: $last)"
  if [ "$RC" -eq 0 ]; then
    # the kill landed while the job was ending, after the victim's last step and save (seen:
    # 8 ms before mpirun exited 0): the chain is then complete, and must equal the
    # uninterrupted run as above; otherwise a kill that mpirun did not report is a failure
    if same "$dir/model.safetensors" "$WORK/ref/full/model.safetensors" &&
      same "$dir/checkpoint.safetensors" "$WORK/ref/full/checkpoint.safetensors"; then
      echo "  the kill came as the run ended (rc=0): chain $chains complete, byte-identical to the uninterrupted run; a new chain starts"
      chains=$((chains + 1))
      rm -rf "$dir"
      mkdir -p "$dir"
      continue
    fi
    fail "random $i: mpirun exited 0 although rank $victim was killed (and the run is not complete)"
  fi
  fle "$end_s" "$KILL_BOUND_S" || fail "random $i: the job ended $end_s s after the kill"
  if [ -f "$dir/checkpoint.safetensors" ]; then
    verify "$dir/checkpoint.safetensors" >/dev/null || fail "random $i: the checkpoint does not load: $after"
    step=$(verify "$dir/checkpoint.safetensors" | sed 's/.*step=//')
    [ $((step % STEPS_PER_EPOCH)) -eq 0 ] || fail "random $i: checkpoint at step $step, not an epoch end"
    same "$dir/checkpoint.safetensors" "$WORK/ref/e1/checkpoint.safetensors" && echo "  (= epoch 1's reference checkpoint)"
    same "$dir/checkpoint.safetensors" "$WORK/ref/e2/checkpoint.safetensors" && echo "  (= epoch 2's reference checkpoint)"
  fi
done
resume_to_end random "$dir"

if [ "$FAILS" -ne 0 ]; then
  echo "train_kill_check: $FAILS failure(s)"
  exit 1
fi
echo "train_kill_check: every kill ended the job within ${KILL_BOUND_S} s, left a complete checkpoint, and --resume reproduced the uninterrupted run byte for byte"
