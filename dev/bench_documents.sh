#!/usr/bin/env bash
# Documents kept apart (-f 1) on one GPU: fox-pro-125m at 2 x 16384 with -A 1, -f 0 against -f 1, on a synthetic
# shard of short documents (dev/make_doc_shard.py: each an EOT then random ids, 512 to 2048 tokens; made when absent).
# A third run is the reference the -f 1 step should approach: the same tokens a step in sequences of the documents'
# own scale (16 x 2048, -A 1, -f 0). The last two are -f 0 and -f 1 without pruning (-A 0): what the documents skip
# alone (at initialisation the gates forget fast, and -A 1 skips most tiles with or without -f 1). Per run: the mean
# step time and tokens/s over the steps after the first SKIP, and the mean share of 128 x 128 attention tiles
# skipped that the step line prints (-A 1: the decay bound; -f 1: also every tile wholly before its query tile's
# document). A benchmark, not a test: each run's exit status is
# printed, none is judged; each run's output stays in $OUT. Last, the attention kernels' share of the -f 0 and -f 1
# steps (dev/trace_step.py: CUPTI, every kernel as it runs).
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

# run NAME BATCH SEQ FLAGS...: one training run and its line: ms a step, tokens/s, tiles skipped
run() {
    local name=$1 batch=$2 seq=$3
    shift 3
    "$BIN" -e "$PRESET" -b "$batch" -t "$seq" -i "$DATA/docs_train_*.bin" -j "$DATA/docs_val_*.bin" \
        -x "$STEPS" -v 0 -s 0 "$@" > "$OUT/$name.txt" 2>&1
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
    printf '%-6s %-24s rc=%d  %s\n' "$name" "$batch x $seq $*" "$rc" "${stats:-no step lines}"
}

run f0 "$B" "$T" -A 1 -f 0
run f1 "$B" "$T" -A 1 -f 1
run ref $((B * T / 2048)) 2048 -A 1 -f 0
run f0A0 "$B" "$T" -A 0 -f 0
run f1A0 "$B" "$T" -A 0 -f 1

# the attention's share of the step at B x T, -f 0 and -f 1 (dev/trace_step.py: CUPTI, every kernel as it runs)
for f in 0 1; do
    python3 dev/trace_step.py --binary "$BIN" --steps 3 --warmup 4 -- -e "$PRESET" -b "$B" -t "$T" \
        -i "$DATA/docs_train_*.bin" -j "$DATA/docs_val_*.bin" -A 1 -f "$f" > "$OUT/trace_f$f.txt" 2>&1
    printf 'f%s attention share: %s; %s\n' "$f" \
        "$(grep -m 1 '^| attention' "$OUT/trace_f$f.txt" | tr -s ' ' || echo 'no trace')" \
        "$(grep -m 1 'steps, per step' "$OUT/trace_f$f.txt")"
done
