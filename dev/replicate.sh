#!/usr/bin/env bash
# The paper's comparison at a small size: FoX (Pro), Transformer (Pro), FoX (LLaMA) and
# Transformer (LLaMA), L = 6, C = 384, H = 6 (head size 64), trained on the Gutenberg corpus at
# context 2048 with the same token budget and the paper's recipe (doc/fox.md: AdamW 0.9/0.95,
# weight decay 0.1, clipping 1.0, linear warmup over 10% of the tokens, cosine to 0); then
# per-token loss at 4x the training context, needle in a haystack up to 2x, gate and attention
# maps, the plots, and a results table (results.md), all in one directory.
#
#   dev/replicate.sh                      # on one H200: ./train_fox, about 3-4 minutes a model
#   MODELS="fox-pro" dev/replicate.sh     # a subset (each stage of each model is resumable)
#   STAGES="report plots" dev/replicate.sh   # only the table and the plots, from what exists
#   CPU_SMOKE=1 dev/replicate.sh          # the same plumbing with ./train_fox_cpu, tiny sizes
#
# Every stage skips what is already done: training resumes from the newest checkpoint in
# <results>/<model>/ (-y 1), evaluation files that exist are kept (delete them to redo).
# Settings (environment): RESULTS (default results/replicate, results/smoke with CPU_SMOKE=1),
# MODELS, STAGES (train eval niah maps report plots), STEPS, LR, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-"fox-pro transformer-pro fox-llama transformer-llama"}
STAGES=${STAGES:-"train eval niah maps report plots"}
PYTHON=${PYTHON:-python3}
if [ "${CPU_SMOKE:-0}" = 1 ]; then
    BIN=./train_fox_cpu
    RESULTS=${RESULTS:-results/smoke}
    SIZE="--n_layer 2 --n_embd 64 --n_head 2"
    T=64; B=2; TOTAL=256; STEPS=${STEPS:-6}; CKPT=3; VAL_EVERY=3; VAL_BATCHES=2
    EVAL_T=256; EVAL_BATCHES=3
    NIAH="-t 128 -D 80,104,128 -E 3"
    MAPS_T=64
else
    BIN=./train_fox
    RESULTS=${RESULTS:-results/replicate}
    SIZE="--n_layer 6 --n_embd 384 --n_head 6"
    # 200 steps of 32 x 2048 tokens: 13.1M tokens (4.2 epochs of the 3.1M-token corpus)
    T=2048; B=16; TOTAL=65536; STEPS=${STEPS:-200}; CKPT=100; VAL_EVERY=50; VAL_BATCHES=0
    EVAL_T=8192; EVAL_BATCHES=0
    NIAH="-t 4096 -E 11"
    MAPS_T=512
fi
LR=${LR:-2e-3}                      # doc/fox.md's peak LR (the Pro models')
WARMUP=$((STEPS * TOTAL / 10))      # 10% of the tokens, as 256M of the paper's 2.7B
FINAL=$(printf "model_%08d.bin" "$STEPS")

say() { echo "replicate: $*"; }
need() { [ -e "$1" ] || { echo "error: $1 is missing. HINT: $2" >&2; exit 1; }; }
has_stage() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

for f in data/gutenberg/gutenberg_train_000000.bin data/gutenberg/gutenberg_val_000000.bin data/gpt2_tokenizer.bin; do
    need "$f" "run 'make data' (or copy data/gutenberg/ and data/gpt2_tokenizer.bin from a machine that has them)"
done
if has_stage train || has_stage eval || has_stage niah || has_stage maps; then
    make "${BIN#./}"
fi
mkdir -p "$RESULTS"

# the maps of the first and last head of the first, middle and last layer
maps_heads() {
    local L=$1 H=$2
    echo "0:0,0:$((H - 1)),$((L / 2)):0,$((L / 2)):$((H - 1)),$((L - 1)):0,$((L - 1)):$((H - 1))"
}
layers_heads() { # L and H of the SIZE overrides
    set -- $SIZE
    local L=0 H=0
    while [ $# -gt 1 ]; do
        case $1 in --n_layer) L=$2 ;; --n_head) H=$2 ;; esac
        shift 2
    done
    echo "$L $H"
}

for model in $MODELS; do
    dir=$RESULTS/$model
    mkdir -p "$dir"
    if has_stage train; then
        if [ -e "$dir/$FINAL" ]; then
            say "$model: trained ($dir/$FINAL)"
        else
            resume=0
            ls "$dir"/model_*.bin >/dev/null 2>&1 && resume=1 # a model file marks a checkpoint
            say "$model: training $STEPS steps of $TOTAL tokens at context $T (resume $resume), log $dir/train.out"
            start=$(date +%s)
            $BIN -e "$model-tiny" $SIZE -b $B -t $T -d $TOTAL -x "$STEPS" -l "$LR" -u $WARMUP -v $VAL_EVERY \
                -m $VAL_BATCHES -s 0 -n $CKPT -o "$dir" -y $resume >> "$dir/train.out" 2>&1 ||
                { tail -5 "$dir/train.out"; exit 1; }
            say "$model: trained in $(( $(date +%s) - start )) s; $(grep 'val loss' "$dir/train.out" | tail -1)"
        fi
    fi
    ckpt=$dir/$FINAL
    if has_stage eval && [ ! -e "$dir/eval.ppl.csv" ]; then
        need "$ckpt" "train it first (STAGES=train)"
        say "$model: per-token loss at context $EVAL_T"
        $BIN -e "$ckpt" -M eval -t $EVAL_T -b 1 -m $EVAL_BATCHES -O "$dir/eval" > "$dir/eval.out" 2>&1 ||
            { tail -5 "$dir/eval.out"; exit 1; }
        tail -n 1 "$dir/eval.out"
    fi
    if has_stage niah && [ ! -e "$dir/eval.niah.csv" ]; then
        need "$ckpt" "train it first (STAGES=train)"
        say "$model: needle in a haystack"
        $BIN -e "$ckpt" -M niah $NIAH -O "$dir/eval" > "$dir/niah.out" 2>&1 || { tail -5 "$dir/niah.out"; exit 1; }
    fi
    if has_stage maps && [ ! -e "$dir/eval.maps.bin" ]; then
        need "$ckpt" "train it first (STAGES=train)"
        say "$model: gate and attention maps on $MAPS_T held-out tokens"
        $BIN -e "$ckpt" -M maps -t $MAPS_T -D "$(maps_heads $(layers_heads))" -O "$dir/eval" > "$dir/maps.out" 2>&1 ||
            { tail -5 "$dir/maps.out"; exit 1; }
    fi
done

# results table: final validation loss, P(l) at the training context and at the longest,
# NIAH: cells whose answer greedy decoding reproduces, per mode
if has_stage report; then
    table=$RESULTS/results.md
    {
        echo "| model | val loss (context $T) | P($T) | P($EVAL_T) | NIAH standard | NIAH easy |"
        echo "|---|---|---|---|---|---|"
        for model in $MODELS; do
            dir=$RESULTS/$model
            val=$(grep -h 'tel:' "$dir/main.log" 2>/dev/null | tail -1 | sed 's/.*tel:\([^ ]*\).*/\1/' || true)
            p_train=$(awk -F, -v l=$T '$1 == l { printf "%.3f", $2 }' "$dir/eval.ppl.csv" 2>/dev/null || true)
            p_long=$(awk -F, -v l=$EVAL_T '$1 == l { printf "%.3f", $2 }' "$dir/eval.ppl.csv" 2>/dev/null || true)
            niah() {
                awk -F, -v m="$1" '$1 == m { n++; s += $8 } END { if (n) printf "%d/%d (%.0f%%)", s, n, 100 * s / n }' \
                    "$dir/eval.niah.csv" 2>/dev/null || true
            }
            echo "| $model | ${val:-n/a} | ${p_train:-n/a} | ${p_long:-n/a} | $(niah standard) | $(niah easy) |"
        done
    } > "$table"
    say "results ($table):"
    cat "$table"
fi

if has_stage plots; then
    if ! $PYTHON -c "import matplotlib" 2>/dev/null; then
        say "plots skipped: $PYTHON has no matplotlib. HINT: apt-get install python3-matplotlib, or copy $RESULTS to a machine that has it and run STAGES=plots dev/replicate.sh there"
        exit 0
    fi
    runs_with() { # label:prefix of each model that has the file
        for model in $MODELS; do [ -e "$RESULTS/$model/eval.$1" ] && printf '%s ' "$model:$RESULTS/$model/eval"; done
        true
    }
    loss_runs=$(runs_with ppl.csv); niah_runs=$(runs_with niah.csv)
    [ -n "$loss_runs" ] && $PYTHON dev/plot_loss.py --train-context $T -o "$RESULTS/loss.png" $loss_runs
    [ -n "$niah_runs" ] && $PYTHON dev/plot_niah.py --train-context $T -o "$RESULTS/niah.png" $niah_runs
    for model in $MODELS; do
        [ -e "$RESULTS/$model/eval.maps.bin" ] &&
            $PYTHON dev/plot_maps.py --max-maps 6 -o "$RESULTS/maps_$model.png" "$RESULTS/$model/eval.maps.bin"
    done
    say "plots in $RESULTS"
fi
