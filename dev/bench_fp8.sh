#!/usr/bin/env bash
# FP8 matmuls (-q) against bf16 on one GPU, whole training steps: fox-pro-125m at 16 x 2048 and 2 x 16384, fox-pro-760m
# at 1 x 16384, each with -q off and -q hybrid (then -q e4m3 and -q body at 125m 16 x 2048), on a shard of random
# tokens (dev/make_doc_shard.py; made when absent): speed only, the loss of random tokens says nothing. Per run: the
# mean step time and tokens/s over the steps after the first SKIP (the first FP8 step also calibrates), the MFU the
# step line prints (FP8 runs count bf16-equivalent FLOPs: the same model FLOPs), the last train loss. A benchmark, not
# a test: each run's exit status is printed, none is judged; each run's output stays in $OUT. The per-matmul table is
# FP8=1 dev/cuda's bench_matmul_algos.
#
#   make train_fox && dev/bench_fp8.sh
#   RUNS="125m:16:2048" MODES="off hybrid" dev/bench_fp8.sh
set -u
BIN=${BIN:-./train_fox}
OUT=${OUT:-bench_fp8}
DATA=${DATA:-data/docs}
STEPS=${STEPS:-30}
SKIP=${SKIP:-5}
RUNS=${RUNS:-"125m:16:2048 125m:2:16384 760m:1:16384"}
MODES=${MODES:-"off hybrid"}
mkdir -p "$OUT" "$DATA"
if [ ! -f "$DATA/docs_train_000000.bin" ]; then
    python3 dev/make_doc_shard.py -o "$DATA/docs_train_000000.bin" -n 8388608 || exit 1
fi
if [ ! -f "$DATA/docs_val_000000.bin" ]; then
    python3 dev/make_doc_shard.py -o "$DATA/docs_val_000000.bin" -n 1048576 --seed 2 || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null | head -1
date -u +%Y-%m-%d
echo "$STEPS steps a run (means of steps $((SKIP + 1)) to $STEPS), shards $DATA/docs_*"

# run NAME PRESET BATCH SEQ FLAGS...: one training run and its line
run() {
    local name=$1 preset=$2 batch=$3 seq=$4
    shift 4
    "$BIN" -e "$preset" -b "$batch" -t "$seq" -i "$DATA/docs_train_*.bin" -j "$DATA/docs_val_*.bin" \
        -x "$STEPS" -v 0 -s 0 "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    local stats
    stats=$(grep '^step ' "$OUT/$name.txt" | awk -F'|' -v skip="$SKIP" '
        NR > skip {
            for (i = 1; i <= NF; i++) {
                if ($i ~ / ms $/) { ms += $i + 0 }
                if ($i ~ /tok\/s/) { tok += $i + 0 }
                if ($i ~ /MFU/) { split($i, w, " "); mfu += w[2] + 0 }
            }
            n++
        }
        { for (i = 1; i <= NF; i++) { if ($i ~ /^ loss /) { split($i, w, " "); loss = w[2] } } }
        END {
            if (n > 0) { printf "%8.1f ms a step %9.0f tok/s  MFU %5.1f%%  last loss %s", ms / n, tok / n, mfu / n, loss }
        }')
    printf '%-24s %-28s rc=%d  %s\n' "$name" "$preset $batch x $seq $*" "$rc" "${stats:-no step lines}"
}

for r in $RUNS; do
    IFS=: read -r size batch seq <<< "$r"
    for m in $MODES; do run "${size}_${batch}x${seq}_$m" "fox-pro-$size" "$batch" "$seq" -q "$m"; done
done
