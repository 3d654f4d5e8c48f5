#!/usr/bin/env bash
# Reliability tests of the CPU trainer (train_fox_cpu), run by `make reliability-test`:
#  1. bit-exact resume: N steps straight == k steps, a new process resumed from the checkpoint
#     at k, N - k more steps (losses and final files, bit for bit); and 3 threads == 2
#  2. crash safety: SIGKILL at random moments (many inside checkpoint writes), resume with -y 1
#     each time: no partial file is ever a checkpoint, the newest complete one always loads,
#     and the run ends bit for bit where the uninterrupted run ends
#  3. disk full during a checkpoint write: a clear error, non-zero exit, the previous
#     checkpoint intact and resumable
#  4. guards: a NaN in the weights stops the run naming a tensor (-G stop), or every step is
#     skipped and the weights stay as they were (-G skip)
#  5. a resume that changes the run is exact or refused: another -b (translated), -t (refused),
#     -d (the schedule follows the tokens seen); a sample at the resumed step; a decode table that
#     does not fit the model (refused at the start); a fresh run into a directory with
#     checkpoints (refused); -x at the checkpoint's step (refused); SIGKILL between the two files
#     of a checkpoint; main.log appended on resume
#  6. the run's start: -o made with its missing parents; a second run into an -o that a run holds
#     refused naming it, the first run untouched; an -o without room for one checkpoint, a full one
#     and a read-only one refused before any step (a small tmpfs in a private mount namespace, where
#     unshare may make one)
# Needs the default shards (make data) and python3. Deterministic except for the kill moments.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-./train_fox_cpu} # BIN=... tests another build
HOOKS_BIN=${HOOKS_BIN:-build/train_fox_cpu_hooks} # the same with the test hooks (train_fox.c, FOX_TEST_HOOKS)
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive # passive: the CI machine may be shared
N=12 # steps
K=6  # resume point
# a small FoX (Pro) on the GPT-2 vocabulary: 3.3M parameters, 40 MB per checkpoint
FLAGS=(-e fox-pro-tiny --n_layer 2 --n_embd 32 --n_head 2 -b 2 -t 32 -l 3e-3 -u 256 -v 0 -s 0 -x $N)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
pass() { echo "ok   $*"; }
bad() { echo "FAIL $*"; failures=$((failures + 1)); }
ckpt() { printf '%s/%s_%08d.bin' "$1" "$2" "$3"; }

# --- 1. bit-exact resume --------------------------------------------------------------------
"$BIN" "${FLAGS[@]}" -n $K -o "$WORK/straight" > "$WORK/straight.out"
mkdir "$WORK/resumed"
cp "$(ckpt "$WORK/straight" model $K)" "$(ckpt "$WORK/straight" state $K)" "$WORK/resumed/"
"$BIN" "${FLAGS[@]}" -n $K -o "$WORK/resumed" -y 1 > "$WORK/resumed.out"
# main.log without the tokens/s field (a timing): losses, lr, norm and tokens seen must agree
grep "^s:" "$WORK/straight/main.log" | awk -F'[: ]' -v k=$K '$2 > k' | sed 's/ tokps:[0-9]*//' > "$WORK/straight.tail"
grep "^s:" "$WORK/resumed/main.log" | sed 's/ tokps:[0-9]*//' > "$WORK/resumed.tail"
if [ "$(wc -l < "$WORK/resumed.tail")" -eq $((N - K)) ] && cmp -s "$WORK/straight.tail" "$WORK/resumed.tail" &&
   cmp -s "$(ckpt "$WORK/straight" model $N)" "$(ckpt "$WORK/resumed" model $N)" &&
   cmp -s "$(ckpt "$WORK/straight" state $N)" "$(ckpt "$WORK/resumed" state $N)"; then
    pass "resume: $N steps straight == $K steps + resume + $((N - K)) steps (main.log's losses, lr, norm, tokens; weights, AdamW moments bit for bit)"
else
    bad "resume: the resumed run differs from the straight one"
    diff "$WORK/straight.tail" "$WORK/resumed.tail" || true
fi
# every sum runs in a fixed order, so the thread count does not matter either
OMP_NUM_THREADS=3 "$BIN" "${FLAGS[@]}" -o "$WORK/threads3" > /dev/null
if cmp -s "$(ckpt "$WORK/straight" model $N)" "$(ckpt "$WORK/threads3" model $N)"; then
    pass "resume: 3 threads give the same weights as 2, bit for bit"
else
    bad "resume: 3 threads give other weights than 2"
fi
MODEL_BYTES=$(stat -c %s "$(ckpt "$WORK/straight" model $N)")
STATE_BYTES=$(stat -c %s "$(ckpt "$WORK/straight" state $N)")

# --- 2. SIGKILL at random moments -----------------------------------------------------------
# every checkpoint file present must be complete; sets newest to the newest complete step or -1
check_dir() {
    local dir=$1 f step size
    newest=-1
    for f in "$dir"/model_*.bin "$dir"/state_*.bin; do
        [ -e "$f" ] || continue
        size=$(stat -c %s "$f")
        case "$f" in *model_*) [ "$size" -eq "$MODEL_BYTES" ] || { bad "crash: partial checkpoint $f ($size bytes)"; } ;;
                     *state_*) [ "$size" -eq "$STATE_BYTES" ] || { bad "crash: partial checkpoint $f ($size bytes)"; } ;; esac
    done
    for f in "$dir"/model_*.bin; do
        [ -e "$f" ] || continue
        step=$((10#$(basename "$f" .bin | sed 's/model_//')))
        if [ -e "$(ckpt "$dir" state "$step")" ] && [ "$step" -gt "$newest" ]; then newest=$step; fi
    done
}
dir="$WORK/crash"
mkdir "$dir"
same_as_straight() {
    cmp -s "$(ckpt "$WORK/straight" model $N)" "$(ckpt "$dir" model $N)" && cmp -s "$(ckpt "$WORK/straight" state $N)" "$(ckpt "$dir" state $N)"
}
RANDOM=$$
kills=0 in_write=0 resumes=0 rounds=0 diverged=0 start=$SECONDS
# rounds of one training run each, killed again and again until it completes
while [ $kills -lt 60 ] && [ $((SECONDS - start)) -lt 30 ]; do
    check_dir "$dir"
    if [ "$newest" -eq $N ]; then  # killed after its final checkpoint: that run is complete (a resume refuses)
        rounds=$((rounds + 1))
        same_as_straight || diverged=$((diverged + 1))
        rm -rf "$dir" && mkdir "$dir"
        continue
    fi
    # keep the disk small: only the newest complete checkpoint stays (leftover .tmp files stay too)
    for f in "$dir"/model_*.bin "$dir"/state_*.bin; do
        [ -e "$f" ] || continue
        step=$((10#$(basename "$f" .bin | sed 's/.*_//')))
        if [ "$step" -lt "$newest" ]; then rm -f "$f"; fi
    done
    resume=0
    if [ "$newest" -ge 0 ]; then resume=1; resumes=$((resumes + 1)); fi
    touch "$WORK/started"
    # writes slowed to 5 ms per MiB (0.2 s a checkpoint) so that many kills land inside them
    TRAIN_FOX_TEST_WRITE_DELAY_MS=5 "$BIN" "${FLAGS[@]}" -n 1 -o "$dir" -y $resume > "$WORK/crash.out" 2>&1 &
    pid=$!
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    if kill -9 $pid 2>/dev/null; then
        wait $pid 2>/dev/null || true
        kills=$((kills + 1))
        # a .tmp file left by the kill stays in place: the next resume must not take it
        if [ -n "$(find "$dir" -name '*.tmp' -newer "$WORK/started")" ]; then in_write=$((in_write + 1)); fi
    elif wait $pid; then
        rounds=$((rounds + 1))
        same_as_straight || diverged=$((diverged + 1))
        rm -rf "$dir" && mkdir "$dir"
    else
        bad "crash: a resumed run failed:"; cat "$WORK/crash.out"; break
    fi
done
check_dir "$dir"
if [ "$newest" -lt $N ] &&
   ! "$BIN" "${FLAGS[@]}" -n 1 -o "$dir" -y $([ "$newest" -ge 0 ] && echo 1 || echo 0) > "$WORK/crash.out" 2>&1; then
    bad "crash: the final resume failed"; cat "$WORK/crash.out"
fi
rounds=$((rounds + 1))
same_as_straight || diverged=$((diverged + 1))
if [ $diverged -eq 0 ]; then
    pass "crash: $kills SIGKILLs ($in_write inside a checkpoint write, $resumes resumes) over $rounds runs: never a partial checkpoint, each run ends bit for bit as the uninterrupted one"
else
    bad "crash: $diverged of $rounds killed and resumed runs ended elsewhere than the uninterrupted one"
fi
[ $in_write -ge 1 ] || bad "crash: no kill landed inside a checkpoint write (the test did not test that)"
[ $resumes -ge 1 ] || bad "crash: no run resumed from a checkpoint (the test did not test that)"

# --- 3. disk full -----------------------------------------------------------------------------
dir="$WORK/full"
mkdir "$dir"
cp "$(ckpt "$WORK/straight" model $K)" "$(ckpt "$WORK/straight" state $K)" "$dir/"
# files may not grow past 1 MiB: every checkpoint write fails with EFBIG (SIGXFSZ ignored)
if (trap '' XFSZ; ulimit -f 1024; exec "$BIN" "${FLAGS[@]}" -n 1 -o "$dir" -y 1) > "$WORK/full.out" 2> "$WORK/full.err"; then
    bad "disk full: the run exited 0"
elif grep -q "could not write" "$WORK/full.err" && grep -q "HINT" "$WORK/full.err" &&
     cmp -s "$(ckpt "$WORK/straight" model $K)" "$(ckpt "$dir" model $K)" &&
     cmp -s "$(ckpt "$WORK/straight" state $K)" "$(ckpt "$dir" state $K)" &&
     [ -z "$(ls "$dir" | grep -v -e "_0*$K.bin" -e main.log -e train_fox.lock)" ]; then
    pass "disk full: non-zero exit with \"$(head -1 "$WORK/full.err")\", previous checkpoint intact, no partial file left"
else
    bad "disk full: wrong outcome"; cat "$WORK/full.err"; ls -l "$dir"
fi
if "$BIN" "${FLAGS[@]}" -n $K -o "$dir" -y 1 > "$WORK/full.out" 2>&1 && cmp -s "$(ckpt "$WORK/straight" model $N)" "$(ckpt "$dir" model $N)"; then
    pass "disk full: the run resumes from the previous checkpoint once there is room, ending bit for bit as the straight run"
else
    bad "disk full: resuming afterwards failed or differs"
fi

# --- 4. guards ----------------------------------------------------------------------------------
# a model whose loss and gradients are NaN from the first step (dev/nan_model.py)
nan_model="$WORK/nan_model.bin"
python3 dev/nan_model.py "$(ckpt "$WORK/straight" model $K)" "$nan_model" || exit 1
GUARD_FLAGS=(-e "$nan_model" -b 2 -t 32 -v 0 -s 0 -x 3)
if "$BIN" "${GUARD_FLAGS[@]}" > "$WORK/stop.out" 2> "$WORK/stop.err"; then
    bad "guard -G stop: a NaN model trained on"
elif grep -q "not finite" "$WORK/stop.err" && grep -q "the gradient of model\." "$WORK/stop.err" && grep -q HINT "$WORK/stop.err"; then
    pass "guard -G stop: non-zero exit with \"$(head -1 "$WORK/stop.err")\""
else
    bad "guard -G stop: wrong message"; cat "$WORK/stop.err"
fi
if "$BIN" "${GUARD_FLAGS[@]}" -G skip -o "$WORK/skip" > "$WORK/skip.out" 2>&1 &&
   [ "$(grep -c 'skip:' "$WORK/skip/main.log")" -eq 3 ] && grep -q "skip:3" "$WORK/skip/main.log" &&
   cmp -s <(tail -c +1025 "$nan_model") <(tail -c +1025 "$(ckpt "$WORK/skip" model 3)"); then
    pass "guard -G skip: all 3 steps skipped and counted in main.log, the weights untouched"
else
    bad "guard -G skip: wrong outcome"; tail -5 "$WORK/skip.out"
fi
# the same with FP8 matmuls (-q hybrid): NaN in the FP8 operands' amaxes too; the saturating casts must not hide it,
# and the message still names the tensor
if "$BIN" "${GUARD_FLAGS[@]}" -q hybrid > "$WORK/stop8.out" 2> "$WORK/stop8.err"; then
    bad "guard -G stop -q hybrid: a NaN model trained on"
elif grep -q "not finite" "$WORK/stop8.err" && grep -q "the gradient of model\.\|the FP8 operand " "$WORK/stop8.err" &&
     grep -q HINT "$WORK/stop8.err"; then
    pass "guard -G stop -q hybrid: non-zero exit with \"$(head -1 "$WORK/stop8.err")\""
else
    bad "guard -G stop -q hybrid: wrong message"; cat "$WORK/stop8.err"
fi
if "$BIN" "${GUARD_FLAGS[@]}" -q hybrid -G skip -o "$WORK/skip8" > "$WORK/skip8.out" 2>&1 &&
   grep -q "skip:3" "$WORK/skip8/main.log" &&
   cmp -s <(tail -c +1025 "$nan_model") <(tail -c +1025 "$(ckpt "$WORK/skip8" model 3)"); then
    pass "guard -G skip -q hybrid: all 3 steps skipped, the weights untouched"
else
    bad "guard -G skip -q hybrid: wrong outcome"; tail -5 "$WORK/skip8.out"
fi

# --- 5. a resume that changes the run: exact or refused ------------------------------------------
R=(-e fox-pro-tiny --n_layer 2 --n_embd 32 --n_head 2 -l 3e-3 -u 256 -v 0 -s 0)
log_field() { # dir, step, field: the value of field on the train line of step in dir/main.log
    awk -v s="s:$2" -v f="$3:" '$1 == s && $2 ~ /^trl:/ { for (i = 2; i <= NF; i++) if (index($i, f) == 1) { print substr($i, length(f) + 1); exit } }' "$1/main.log"
}
close_to() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= tol) }'; }
refused() { # name, expected message part, command...: a non-zero exit with the message and a HINT
    local name=$1 want=$2
    shift 2
    if "$@" > "$WORK/refused.out" 2> "$WORK/refused.err"; then
        bad "$name: exited 0"; return 1
    elif grep -q -- "$want" "$WORK/refused.err" && grep -q "HINT" "$WORK/refused.err"; then
        pass "$name: refused with \"$(head -1 "$WORK/refused.err" | cut -c1-150)\""
    else
        bad "$name: wrong message"; cat "$WORK/refused.err"; return 1
    fi
}
# one straight run of 3 steps of 4 x 32 tokens, checkpoints at 2 and 3
"$BIN" "${R[@]}" -b 4 -t 32 -d 128 -x 3 -n 2 -o "$WORK/straight_b4" > /dev/null
mkdir "$WORK/resume_b2"
cp "$(ckpt "$WORK/straight_b4" model 2)" "$(ckpt "$WORK/straight_b4" state 2)" "$WORK/resume_b2/"
"$BIN" "${R[@]}" -b 2 -t 32 -d 128 -x 3 -o "$WORK/resume_b2" -y 1 > "$WORK/resume_b2.out"
a=$(log_field "$WORK/straight_b4" 3 trl) b=$(log_field "$WORK/resume_b2" 3 trl)
if close_to "$a" "$b" 1e-5; then
    pass "resume with -b 2 from a -b 4 checkpoint: step 3 trains on the same sequences (loss $b, straight $a)"
else
    bad "resume with -b 2 from a -b 4 checkpoint: step 3 loss $b, the straight run's $a"
fi
refused "resume with another -t" "was written by a run with -t 32" \
    "$BIN" "${R[@]}" -b 4 -t 16 -d 128 -x 3 -o "$WORK/resume_b2" -y 1
refused "resume with another seed" "seed -S" "$BIN" "${R[@]}" -b 4 -t 32 -d 128 -x 4 -S 7 -o "$WORK/straight_b4" -y 1
refused "resume with -R 1" "-R 0" "$BIN" "${R[@]}" -b 4 -t 32 -d 128 -x 4 -R 1 -o "$WORK/straight_b4" -y 1
refused "resume with -x at the checkpoint's step" "no step is left" \
    "$BIN" "${R[@]}" -b 4 -t 32 -d 128 -x 3 -o "$WORK/straight_b4" -y 1
# -d: a checkpoint after 2 steps of 64 tokens resumed with -d 128 for one step: the rate comes
# from the 128 tokens seen, the end of the schedule from 128 + 1 x 128
"$BIN" "${R[@]}" -b 2 -t 32 -d 64 -x 4 -n 2 -u 100 -o "$WORK/d64" > /dev/null
mkdir "$WORK/d128"
cp "$(ckpt "$WORK/d64" model 2)" "$(ckpt "$WORK/d64" state 2)" "$WORK/d128/"
"$BIN" "${R[@]}" -b 2 -t 32 -d 128 -x 3 -u 100 -o "$WORK/d128" -y 1 > "$WORK/d128.out"
lr=$(log_field "$WORK/d128" 3 lr) tokens=$(log_field "$WORK/d128" 3 tokens)
want=$(awk 'BEGIN { p = (128 - 100) / (256 - 100); printf "%.6e", 3e-3 * 0.5 * (1 + cos(3.141592653589793 * p)) }')
if close_to "$lr" "$want" 1e-6 && [ "$tokens" = 256 ] && grep -q "note: the run had -d 64" "$WORK/d128.out"; then
    pass "resume with -d 128 after 2 steps of -d 64: step 3's lr $lr from the 128 tokens seen ($want), 256 tokens after it"
else
    bad "resume with another -d: step 3 lr $lr (want $want), tokens $tokens (want 256)"
fi
# a sample and validation at the resumed step, before any training step of the new process
"$BIN" "${R[@]}" -b 2 -t 32 -x 4 -n 2 -s 2 -v 4 -m 1 -o "$WORK/sample_first" > /dev/null
mkdir "$WORK/sample_resume"
cp "$(ckpt "$WORK/sample_first" model 2)" "$(ckpt "$WORK/sample_first" state 2)" "$WORK/sample_resume/"
if "$BIN" "${R[@]}" -b 2 -t 32 -x 4 -n 2 -s 2 -v 4 -m 1 -o "$WORK/sample_resume" -y 1 > "$WORK/sample_resume.out" 2>&1 &&
   cmp -s "$(ckpt "$WORK/sample_first" model 4)" "$(ckpt "$WORK/sample_resume" model 4)"; then
    pass "resume at a step that samples first: runs, and ends bit for bit as the straight run"
else
    bad "resume at a step that samples first failed"; tail -3 "$WORK/sample_resume.out"
fi
# a model whose vocabulary the decode table's end-of-text token does not fit: refused before training
python3 - "$WORK/small_000000.bin" <<'PYEOF'
import struct, sys
tokens = [(i * 7919) % 1000 for i in range(20000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PYEOF
SMALL=(-e fox-pro-tiny --n_layer 2 --n_embd 32 --n_head 2 --vocab_size 1000 -i "$WORK/small_*.bin" -j "$WORK/small_*.bin" -b 2 -t 32 -x 2 -v 1 -m 1)
refused "samples with a decode table that does not fit the model" "outside the model's vocabulary" \
    "$BIN" "${SMALL[@]}" -s 1 -o "$WORK/small_vocab"
if [ ! -e "$WORK/small_vocab/main.log" ] && ! grep -q '^step' "$WORK/refused.out" &&
   "$BIN" "${SMALL[@]}" -s 0 -o "$WORK/small_vocab" > /dev/null && [ -e "$(ckpt "$WORK/small_vocab" model 2)" ]; then
    pass "the decode table is checked before any step, and the same run with -s 0 trains and checkpoints"
else
    bad "the decode table check came late, or the run with -s 0 failed"
fi
# a fresh run into a directory holding another run's checkpoints
cp "$(ckpt "$WORK/straight_b4" model 3)" "$WORK/model3.copy"
refused "a fresh run into a directory with checkpoints" "already holds" \
    "$BIN" "${R[@]}" -b 4 -t 32 -d 128 -x 5 -S 7 -o "$WORK/straight_b4"
cmp -s "$WORK/model3.copy" "$(ckpt "$WORK/straight_b4" model 3)" || bad "the refused run changed the old checkpoints"
# SIGKILL between the state and the model file of step 4: the resume takes step 2, ends as the straight run
"$BIN" "${R[@]}" -b 2 -t 32 -x 6 -n 2 -o "$WORK/between_straight" > /dev/null
killed=0
TRAIN_FOX_TEST_KILL_BETWEEN=4 "$HOOKS_BIN" "${R[@]}" -b 2 -t 32 -x 6 -n 2 -o "$WORK/between" > /dev/null 2>&1 || killed=$?
if [ $killed -ne 0 ] && [ -e "$(ckpt "$WORK/between" state 4)" ] && [ ! -e "$(ckpt "$WORK/between" model 4)" ] &&
   "$BIN" "${R[@]}" -b 2 -t 32 -x 6 -n 2 -o "$WORK/between" -y 1 > "$WORK/between.out" &&
   grep -q "resumed from .*model_00000002.bin at step 2" "$WORK/between.out" &&
   cmp -s "$(ckpt "$WORK/between_straight" model 6)" "$(ckpt "$WORK/between" model 6)" &&
   cmp -s "$(ckpt "$WORK/between_straight" state 6)" "$(ckpt "$WORK/between" state 6)"; then
    pass "SIGKILL between the two files of a checkpoint: the resume takes the one before, ends bit for bit"
else
    bad "SIGKILL between the two files of a checkpoint (exit $killed): wrong outcome"; cat "$WORK/between.out" 2>/dev/null | tail -3
fi
# main.log of the killed run kept, the resumed steps appended: s:1-4, then s:3-6
steps=$(grep -o '^s:[0-9]* trl' "$WORK/between/main.log" | tr -dc '0-9\n' | tr '\n' ' ' || true)
if [ "$steps" = "1 2 3 4 3 4 5 6 " ]; then
    pass "main.log is appended on resume (train steps logged: $steps)"
else
    bad "main.log after a resume holds the train steps '$steps', not '1 2 3 4 3 4 5 6 '"
fi

# --- 6. the run's start: -o made, locked, write-tested ---------------------------------------------
# -o with missing parents: made; run A holds -o while it trains (writes slowed), B into the same -o is refused
dir="$WORK/new/parents/locked"
TRAIN_FOX_TEST_WRITE_DELAY_MS=20 "$BIN" "${FLAGS[@]}" -n 4 -o "$dir" > "$WORK/lock_a.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^pid $pid " "$dir/train_fox.lock" 2>/dev/null && break; sleep 0.1; done
refused "a second run into an -o that a run holds" "in use by another run: pid $pid " \
    "$BIN" "${FLAGS[@]}" -S 2 -n 1 -o "$dir" || true
if wait $pid && cmp -s "$(ckpt "$WORK/straight" model $N)" "$(ckpt "$dir" model $N)"; then
    pass "-o with two missing parents made; the run holding it ends bit for bit as the straight run"
else
    bad "the run holding -o failed or was disturbed"; tail -3 "$WORK/lock_a.out"
fi
# a small filesystem of its own: no room for one checkpoint (40 MB), full, read-only
mnt="$WORK/mnt"
mkdir "$mnt"
in_tmpfs() { # mount options, then a command run with a tmpfs on $mnt
    local opts=$1
    shift
    unshare -rm sh -c 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"' sh "$opts" "$mnt" "$@"
}
if in_tmpfs size=1m true 2> /dev/null; then
    refused_at_start() { # as refused, and before any step
        refused "$@" || return 0
        if grep -q '^step' "$WORK/refused.out"; then bad "$1: steps ran before the refusal"; fi
    }
    refused_at_start "an -o without room for one checkpoint" "one checkpoint of this model needs" \
        in_tmpfs size=8m "$BIN" "${FLAGS[@]}" -o "$mnt/run"
    refused_at_start "a full -o" "No space left on device" in_tmpfs size=1m \
        sh -c 'cat /dev/zero > "$0/fill" 2> /dev/null; exec "$@"' "$mnt" "$BIN" "${FLAGS[@]}" -o "$mnt/run"
    refused_at_start "a read-only -o" "Read-only file system" in_tmpfs ro,size=1m "$BIN" "${FLAGS[@]}" -o "$mnt/run"
else
    echo "skip a small, a full and a read-only -o: unshare cannot mount a tmpfs here"
fi

echo "reliability: $failures failure(s)"
[ $failures -eq 0 ]
