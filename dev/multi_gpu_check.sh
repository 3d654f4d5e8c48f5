#!/usr/bin/env bash
# Data-parallel evidence for train_fox on one node: builds, checks that 1, 2 and 4 GPUs (ZeRO 0
# and 1, by hand and under mpirun) train to the same losses, that resuming is exact (also on
# another GPU count), then measures tokens/s per GPU for fox-pro-125m and fox-pro-760m.
#
#   dev/multi_gpu_check.sh [log dir]          (default log_multi_gpu; about 5-8 min on 4 H200s)
#
# Environment: NGPU (default: the GPUs nvidia-smi lists, at most 4), LOSS_TOL (default 0.05),
# TRAIN / VAL (shard patterns, default the Gutenberg shards of make data), BENCH=0 skips the
# benchmark, CHECK=0 skips the correctness part, RUN_TIMEOUT (seconds per run, default 300).
# Exit status: non-zero when a comparison fails or a run fails.
set -u
cd "$(dirname "$0")/.." || exit 1
LOGDIR=${1:-log_multi_gpu}
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
if [ "$NGPU" -gt 4 ]; then NGPU=4; fi
# Tolerances of a comparison between GPU counts (the same sequences in the same micro-batches,
# only the order of the gradient sums differs): the first step's loss to 1e-6 and its gradient
# norm to the printed digits, the next four steps to EARLY_TOL (rounding differences before
# training amplifies them: <= 3e-5 measured), every step and validation to LOSS_TOL (20 bf16 steps
# whose sums are only reordered drift apart by up to 3.4e-2, measured on one GPU: dev/RESULTS.md,
# "Why ZeRO-0 and ZeRO-1 drift apart").
LOSS_TOL=${LOSS_TOL:-0.05}
EARLY_TOL=${EARLY_TOL:-1e-3}
TRAIN=${TRAIN:-data/gutenberg/gutenberg_train_*.bin}
VAL=${VAL:-data/gutenberg/gutenberg_val_*.bin}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
mkdir -p "$LOGDIR"
FAILURES=0
START=$(date +%s)
say() { echo "$@" | tee -a "$LOGDIR/summary.txt"; }
: > "$LOGDIR/summary.txt"
say "multi_gpu_check: $NGPU GPU(s), logs in $LOGDIR, $(date -u +%Y-%m-%dT%H:%MZ)"
nvidia-smi -L 2>/dev/null | tee -a "$LOGDIR/summary.txt"
if [ "$NGPU" -lt 2 ]; then echo "error: needs at least 2 GPUs (found $NGPU)"; exit 1; fi

# --- (1) build: with MPI when mpicc exists (the MPI build also runs without mpirun) -----------
MPI_BUILD=0
if command -v mpicc >/dev/null && make train_fox USE_MPI=1 -B > "$LOGDIR/build.txt" 2>&1; then
    MPI_BUILD=1
elif ! make train_fox -B > "$LOGDIR/build.txt" 2>&1; then
    cat "$LOGDIR/build.txt"; echo "FAIL build"; exit 1
fi
say "built train_fox (MPI support: $MPI_BUILD)"

# launch NAME WORLD RENDEZVOUS FLAGS...: WORLD processes on GPUs 0..WORLD-1 with -W/-I/-F
# (one process, no flags, when WORLD is 1); rank 0's output is NAME.log
launch() {
    local name=$1 world=$2 rdv=$3
    shift 3
    local gpus pids=() rc=0
    gpus=$(seq -s, 0 $((world - 1)))
    if [ "$world" -gt 1 ]; then rm -f "$rdv" "$rdv".ack*; fi
    for ((r = 0; r < world; r++)); do
        local dp=()
        if [ "$world" -gt 1 ]; then dp=(-W "$world" -I "$r" -F "$rdv"); fi
        env -u OMPI_COMM_WORLD_LOCAL_RANK -u SLURM_LOCALID -u LOCAL_RANK CUDA_VISIBLE_DEVICES="$gpus" \
            timeout "$RUN_TIMEOUT" ./train_fox ${dp[@]+"${dp[@]}"} "$@" > "$LOGDIR/$name.r$r.txt" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    cp "$LOGDIR/$name.r0.txt" "$LOGDIR/$name.log"
    if [ $rc -ne 0 ]; then
        say "FAIL run $name: a process failed; last lines:"
        for ((r = 0; r < world; r++)); do tail -n 3 "$LOGDIR/$name.r$r.txt" | sed "s/^/  r$r: /" | tee -a "$LOGDIR/summary.txt"; done
        FAILURES=$((FAILURES + 1))
    fi
    return $rc
}

# compare NAME REF TEST TOL FIRST LAST: the train losses of steps FIRST..LAST (and the
# validation losses logged at those steps) of TEST against REF, within TOL absolute; with TOL > 0
# also the first step (loss 1e-6, norm 2e-4: printed to 4 decimals) and the next four (EARLY_TOL)
compare() {
    local name=$1 ref=$2 test=$3 tol=$4 first=$5 last=$6 out
    out=$(awk -v tol="$tol" -v early="$EARLY_TOL" -v first="$first" -v last="$last" '
        function absd(x) { return x < 0 ? -x : x }
        /^step +[0-9]+\/[0-9]+ \| loss / {
            split($2, s, "/"); k = s[1] + 0
            if (FNR == NR) { r[k] = $5; rn[k] = $8 } else { t[k] = $5; tn[k] = $8 }
        }
        /^step [0-9]+: val loss / { k = $2 + 0; if (FNR == NR) rv[k] = $5; else tv[k] = $5 }
        END {
            n = 0; bad = 0; mx = 0; mxv = 0; nv = 0; mxe = 0
            for (k = first; k <= last; k++) {
                if (!(k in r) || !(k in t)) { bad = 1; missing = k; continue }
                d = absd(r[k] - t[k]); n++
                if (d > mx) mx = d
                if (k < first + 5 && d > mxe) mxe = d
                if (d > tol) bad = 1
                if (tol > 0 && k == first && (d > 1e-6 || absd(rn[k] - tn[k]) > 2e-4)) bad = 1
                if (tol > 0 && k < first + 5 && d > early) bad = 1
            }
            for (k in tv) if (k in rv && k + 0 >= first - 1 && k + 0 <= last) {
                d = absd(rv[k] - tv[k]); nv++
                if (d > mxv) mxv = d
                if (d > tol) bad = 1
            }
            verdict = bad ? "FAIL" : "PASS"
            rules = tol > 0 ? sprintf(", first step 1e-6 and same norm, steps %d-%d %g: max %.2e", first + 1, first + 4, early, mxe) : ""
            gap = missing ? sprintf("; step %d missing", missing) : ""
            printf "%s %d steps, max |dloss| %.2e; %d val losses, max |dval| %.2e (tol %g%s)%s\n", verdict, n, mx, nv, mxv, tol, rules, gap
        }' "$LOGDIR/$ref.log" "$LOGDIR/$test.log")
    case $out in
        PASS*) say "$out: $name" ;;
        *) say "FAIL ${out#FAIL }: $name"; FAILURES=$((FAILURES + 1)) ;;
    esac
}

# --- (2) correctness: same global batch on 1, 2, 4 GPUs ----------------------------------------
# L=7, C=384, H=3: 52,090,005 parameters, an odd count, so the ZeRO-1 shards are padded on 2
# and 4 GPUs. Global batch 4 x 8 x 1024 tokens (1 GPU: 4 accumulation steps).
SMALL=(-e fox-pro-tiny --n_layer 7 --n_embd 384 --n_head 3 -i "$TRAIN" -j "$VAL" -b 8 -t 1024 -d 32768
       -x 20 -l 2e-3 -u 65536 -v 10 -m 4 -s 0)
if [ "${CHECK:-1}" = 1 ]; then
    say "--- correctness (fox-pro L7 C384 H3, T=1024, 32768 tokens a step, 20 steps) ---"
    rm -rf "$LOGDIR/ckpt_2gpu" "$LOGDIR/resume_2gpu" "$LOGDIR/resume_4gpu"
    launch gpu1 1 none "${SMALL[@]}"
    launch gpu2_zero1 2 "$LOGDIR/nccl_id" "${SMALL[@]}" -Q 1 -o "$LOGDIR/ckpt_2gpu" -n 10 && compare "2 GPUs ZeRO-1 (file rendezvous, checkpoints at 10 and 20) vs 1 GPU" gpu1 gpu2_zero1 "$LOSS_TOL" 1 20
    launch gpu2_zero0 2 "$LOGDIR/nccl_id" "${SMALL[@]}" -Q 0 && compare "2 GPUs ZeRO-0 vs 1 GPU" gpu1 gpu2_zero0 "$LOSS_TOL" 1 20
    if [ "$NGPU" -ge 4 ]; then
        launch gpu4_zero1 4 tcp://127.0.0.1:$((29000 + RANDOM % 1000)) "${SMALL[@]}" -Q 1 && compare "4 GPUs ZeRO-1 (TCP rendezvous) vs 1 GPU" gpu1 gpu4_zero1 "$LOSS_TOL" 1 20
        launch gpu4_zero0 4 "$LOGDIR/nccl_id" "${SMALL[@]}" -Q 0 && compare "4 GPUs ZeRO-0 vs 1 GPU" gpu1 gpu4_zero0 "$LOSS_TOL" 1 20
        [ -f "$LOGDIR/gpu4_zero1.log" ] && [ -f "$LOGDIR/gpu4_zero0.log" ] && compare "4 GPUs ZeRO-0 vs ZeRO-1" gpu4_zero1 gpu4_zero0 "$LOSS_TOL" 1 20
    else
        say "SKIP 4-GPU comparisons (only $NGPU GPUs)"
    fi
    # resume: the 2-GPU run's checkpoint at step 10, continued to 20, must repeat steps 11-20
    # bit for bit; continued on 4 GPUs (re-sharded) it must match within the tolerance
    if [ -f "$LOGDIR/ckpt_2gpu/model_00000010.bin" ]; then
        for d in resume_2gpu resume_4gpu; do
            mkdir -p "$LOGDIR/$d"
            cp "$LOGDIR/ckpt_2gpu/model_00000010.bin" "$LOGDIR/ckpt_2gpu/state_00000010.bin" "$LOGDIR/$d/"
        done
        launch resume2 2 "$LOGDIR/nccl_id" "${SMALL[@]}" -Q 1 -o "$LOGDIR/resume_2gpu" -y 1 && compare "resume at step 10 on 2 GPUs vs the straight 2-GPU run (exact)" gpu2_zero1 resume2 0 11 20
        if [ "$NGPU" -ge 4 ]; then
            launch resume4 4 "$LOGDIR/nccl_id" "${SMALL[@]}" -Q 1 -o "$LOGDIR/resume_4gpu" -y 1 && compare "resume of the 2-GPU checkpoint on 4 GPUs vs the straight 2-GPU run" gpu2_zero1 resume4 "$LOSS_TOL" 11 20
        fi
    else
        say "FAIL resume: the 2-GPU run wrote no checkpoint at step 10"; FAILURES=$((FAILURES + 1))
    fi
    if command -v mpirun >/dev/null && [ "$NGPU" -ge 2 ]; then
        MPI_FLAGS=(-np "$NGPU" --bind-to none -x CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((NGPU - 1)))")
        if [ "$(id -u)" = 0 ]; then MPI_FLAGS+=(--allow-run-as-root); fi
        EXTRA=()
        if [ "$MPI_BUILD" = 0 ]; then EXTRA=(-F "$LOGDIR/nccl_id_mpi"); rm -f "$LOGDIR/nccl_id_mpi"*; fi # ranks from mpirun's environment
        if timeout "$RUN_TIMEOUT" mpirun "${MPI_FLAGS[@]}" ./train_fox "${SMALL[@]}" -Q 1 ${EXTRA[@]+"${EXTRA[@]}"} > "$LOGDIR/mpirun.log" 2>&1; then
            compare "mpirun -np $NGPU (MPI build: $MPI_BUILD) vs 1 GPU" gpu1 mpirun "$LOSS_TOL" 1 20
        else
            say "FAIL run mpirun: $(tail -n 2 "$LOGDIR/mpirun.log" | tr '\n' ' ')"; FAILURES=$((FAILURES + 1))
        fi
    else
        say "SKIP mpirun (not installed)"
    fi
fi

# --- (3) throughput per GPU: fixed micro-batch per GPU, median step after warm-up -----------------
# step_median LOG WARM ACTION: the lower median of what the awk ACTION prints for field i of the
# step lines after step WARM ("-" when nothing)
step_median() {
    awk -v warm="$2" '/^step +[0-9]+\/[0-9]+ \| loss / { split($2, s, "/"); if (s[1] + 0 > warm) for (i = 1; i < NF; i++) '"$3"' }' "$1" |
        sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else print v[int((NR + 1) / 2)] }'
}
# bench MODEL T B STEPS WARMUP: prints a row per GPU count
bench() {
    local model=$1 T=$2 B=$3 steps=$4 warm=$5 base=""
    for world in 1 2 4; do
        if [ "$world" -gt "$NGPU" ]; then continue; fi
        local name=bench_${model}_T${T}_gpu$world
        launch "$name" "$world" "$LOGDIR/nccl_id" -e "$model" -i "$TRAIN" -b "$B" -t "$T" -d $((B * T * world)) -x "$steps" -v 0 -s 0 -l 1e-3 || continue
        local ms
        ms=$(awk -v warm="$warm" '/^step +[0-9]+\/[0-9]+ \| loss / { split($2, s, "/"); if (s[1] + 0 > warm) for (i = 1; i < NF; i++) if ($(i + 1) == "ms") { print $i; break } }' "$LOGDIR/$name.log" |
             sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
        if [ -z "$ms" ]; then say "FAIL bench $name: no step times"; FAILURES=$((FAILURES + 1)); continue; fi
        local comm wait # medians of sync+comm and of its wait for the slowest rank's backward
        comm=$(step_median "$LOGDIR/$name.log" "$warm" 'if ($i == "sync+comm") print $(i + 1)')
        wait=$(step_median "$LOGDIR/$name.log" "$warm" 'if ($i == "rank" && $(i + 2) ~ /^\+/) print substr($(i + 2), 2)')
        local per_gpu
        per_gpu=$(awk -v b="$B" -v t="$T" -v ms="$ms" 'BEGIN { printf "%.0f", b * t / (ms / 1000) }')
        if [ -z "$base" ]; then base=$per_gpu; fi
        say "$(awk -v m="$model" -v T="$T" -v B="$B" -v w="$world" -v ms="$ms" -v pg="$per_gpu" -v base="$base" -v c="$comm" -v wt="$wait" \
              'BEGIN { printf "| %s | %5d | %2d | %d | %8.1f | %s | %s | %9.0f | %9.0f | %5.1f%% |", m, T, B, w, ms, c, wt, pg * w, pg, 100 * pg / base }')"
    done
}
if [ "${BENCH:-1}" = 1 ]; then
    say "--- throughput: ZeRO-1 with 2+ GPUs, median step time after warm-up ---"
    say "| model |     T | B/GPU | GPUs | step ms | of it after the backward (sync+comm) | of that, waiting for the slowest rank | tokens/s | tokens/s/GPU | per-GPU efficiency vs 1 GPU |"
    say "|---|---|---|---|---|---|---|---|---|---|"
    bench fox-pro-125m 2048 16 20 5
    bench fox-pro-125m 16384 2 10 3
    bench fox-pro-760m 16384 1 8 3
fi

say "done in $(($(date +%s) - START)) s: $FAILURES failure(s)"
[ "$FAILURES" -eq 0 ]
