#!/usr/bin/env bash
# Documents kept apart (-f 1) on one GPU: fox-pro-125m at 2 x 16384 with -A 1, -f 0 against -f 1, on a synthetic
# shard of short documents (dev/make_doc_shard.py: each an EOT then random ids, 512 to 2048 tokens; made when absent).
# Per run: the mean step time and tokens/s over the steps after the first SKIP, and the mean share of 128 x 128
# attention tiles skipped that the step line prints (-A 1: the decay bound; -f 1: also every tile wholly before its
# query tile's document). A benchmark, not a test: each run's exit status is printed, none is judged; each run's
# output stays in $OUT.
#
#   make train_fox && dev/bench_documents.sh
#   PRESET=fox-pro-760m STEPS=40 dev/bench_documents.sh
set -u
BIN=${BIN:-./train_fox}
OUT=${OUT:-bench_documents}
DATA=${DATA:-data/docs}
PRESET=${PRESET:-fox-pro-125m}
B=${B:-2}
T=${T:-16384}
STEPS=${STEPS:-30}
SKIP=${SKIP:-5}
mkdir -p "$OUT" "$DATA"
if [ ! -f "$DATA/docs_train_000000.bin" ]; then
    python3 dev/make_doc_shard.py -o "$DATA/docs_train_000000.bin" -n 8388608 || exit 1
fi
if [ ! -f "$DATA/docs_val_000000.bin" ]; then
    python3 dev/make_doc_shard.py -o "$DATA/docs_val_000000.bin" -n 1048576 --seed 2 || exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
date -u +%Y-%m-%d
echo "$PRESET, $B x $T, $STEPS steps (mean of steps $((SKIP + 1)) to $STEPS), shards $DATA/docs_*"

# run NAME FLAGS...: one training run and its line: ms a step, tokens/s, tiles skipped
run() {
    local name=$1
    shift
    "$BIN" -e "$PRESET" -b "$B" -t "$T" -i "$DATA/docs_train_*.bin" -j "$DATA/docs_val_*.bin" -x "$STEPS" -v 0 -s 0 \
        "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    local stats
    stats=$(grep '^step ' "$OUT/$name.txt" | awk -F'|' -v skip="$SKIP" '
        NR > skip {
            for (i = 1; i <= NF; i++) {
                if ($i ~ / ms $/) { ms += $i + 0 }
                if ($i ~ /tok\/s/) { tok += $i + 0 }
                if ($i ~ /pruned/) { split($i, w, " "); pruned += w[2] + 0 }
            }
            n++
        }
        END {
            if (n > 0) { printf "%8.1f ms a step %9.0f tok/s   %5.1f%% of tiles skipped", ms / n, tok / n, pruned / n }
        }')
    printf '%-6s %-14s rc=%d  %s\n' "$name" "$*" "$rc" "${stats:-no step lines}"
}

run f0 -A 1 -f 0
run f1 -A 1 -f 1
