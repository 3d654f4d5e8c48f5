#!/usr/bin/env bash
# Loss parity of FP8 matmuls (-q) with bf16 on one GPU: two runs from the same initialisation, data and order, -q off
# and -q $MODE (default hybrid), of fox-pro with 6 layers, n_embd 384 and 6 heads (30M parameters, 19M of them the
# embedding) on the Gutenberg shards (data/gutenberg, 3.1M tokens: make data): 8 x 512 tokens a step, 700 steps
# (2.9M tokens, under one epoch: the loss still falls at the end), the validation loss every 50 steps on 20 batches.
# Prints both runs' final validation loss and their relative difference, and plots both curves into $OUT/parity.png
# (dev/plot_log.py, where matplotlib is installed). Each run's log stays in $OUT/<mode>/main.log.
#
#   make train_fox && dev/fp8_parity.sh
#   MODE=e4m3 STEPS=1000 dev/fp8_parity.sh
set -u
BIN=${BIN:-./train_fox}
OUT=${OUT:-fp8_parity}
DATA=${DATA:-data/gutenberg}
MODE=${MODE:-hybrid}
STEPS=${STEPS:-700}
MODEL=${MODEL:-"-e fox-pro-tiny --n_layer 6 --n_embd 384 --n_head 6"}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
date -u +%Y-%m-%d
for q in off "$MODE"; do
    rm -rf "${OUT:?}/$q"
    # shellcheck disable=SC2086
    "$BIN" $MODEL -b 8 -t 512 -x "$STEPS" -v 50 -m 20 -s 0 -q "$q" -i "$DATA/gutenberg_train_*.bin" \
        -j "$DATA/gutenberg_val_*.bin" -o "$OUT/$q" > "$OUT/$q.txt" 2>&1
    echo "-q $q: rc=$?, $(grep -c '^step ' "$OUT/$q.txt") step lines, $(grep -h 'tel:' "$OUT/$q/main.log" | tail -n 1)"
done
# the validation loss at the last step of a run, or nothing when it did not get there
final() { grep -h "^s:$STEPS tel:" "$OUT/$1/main.log" 2>/dev/null | tail -n 1 | sed 's/.*tel:\([0-9.]*\).*/\1/'; }
a=$(final off); b=$(final "$MODE")
if [ -z "$a" ] || [ -z "$b" ]; then
    echo "no comparison: a run did not reach step $STEPS (see $OUT/off.txt, $OUT/$MODE.txt)"
else
    python3 -c "a, b = float('$a'), float('$b'); print(f'final val loss: bf16 {a:.4f}, -q $MODE {b:.4f}, ' \
                                                       f'relative difference {(b - a) / a * 100:+.2f}%')"
fi
python3 dev/plot_log.py -o "$OUT/parity.png" "bf16:$OUT/off" "fp8 $MODE:$OUT/$MODE" 2>&1 | tail -n 2
