#!/usr/bin/env bash
# The paper's comparison at a small size, designed so that the 3.2M-token Gutenberg corpus can show
# its effects: FoX (Pro), Transformer (Pro), FoX (LLaMA) and Transformer (LLaMA), L = 6, C = 384,
# H = 6 (head size 64), the paper's recipe (dev/fox.md: AdamW 0.9/0.95, weight decay 0.1, clipping
# 1.0, linear warmup over 10% of the tokens, cosine to 0), trained at context 256 for 1.48 epochs
# of the training books and evaluated at 32x that context on six held-out books
# (data/gutenberg/long/, `sh data/prepare.sh long`: 53 sequences of 8192 tokens).
#
# Stages, each resumable (what is done is kept; delete a file to redo it):
#   data    the held-out split data/gutenberg/long/ (sh data/prepare.sh long) if it is missing
#   sweep   each model at each peak learning rate of LRS, first seed; the lowest final validation
#           loss picks the model's LR (<results>/sweep.csv, lr.csv; LR=<value> skips the sweep)
#   train   each model at its LR for every seed of SEEDS (the sweep's run is the first seed's)
#   eval    per-token loss L(i) and P(l) at EVAL_T (-M eval) of every run
#   niah    needle in a haystack within the training context (-M niah), every run
#   maps    forget gate and attention maps of six heads (-M maps), first seed
#   gates   every head's mean decay length from -M maps of all heads (FoX models, every run)
#   report  <results>/results.md: the sweep, the table (mean +- sd over seeds), the gates, timings
#   plots   loss.png (L(i) with the seeds' range, P(l)), niah.png, gates.png, maps_<model>.png
#
#   dev/replicate.sh                        # one H100 or H200: ./train_fox, about 5 minutes
#   MODELS="fox-pro transformer-pro" dev/replicate.sh   # a subset
#   STAGES="report plots" dev/replicate.sh  # only the table and the plots, from what exists
#   CPU_SMOKE=1 dev/replicate.sh            # the same plumbing with ./train_fox_cpu, tiny sizes
#
# Settings (environment): RESULTS (default results/replicate, results/smoke with CPU_SMOKE=1),
# MODELS, STAGES, SEEDS, LRS, LR, T, B, TOTAL (tokens a step), STEPS, EVAL_T, DATA_DIR, PYTHON,
# BIN (a prebuilt trainer; by default the script makes ./train_fox or ./train_fox_cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-"fox-pro transformer-pro fox-llama transformer-llama"}
STAGES=${STAGES:-"data sweep train eval niah maps gates report plots"}
PYTHON=${PYTHON:-python3}
SEEDS=${SEEDS:-"1 2 3"}
LRS=${LRS:-"1e-3 2e-3 4e-3"}
DATA_DIR=${DATA_DIR:-data/gutenberg/long}
MAKE_BIN=1
[ -n "${BIN:-}" ] && MAKE_BIN=0
if [ "${CPU_SMOKE:-0}" = 1 ]; then
    BIN=${BIN:-./train_fox_cpu}
    RESULTS=${RESULTS:-results/smoke}
    SIZE="--n_layer 2 --n_embd 64 --n_head 2"
    T=${T:-32}; B=${B:-2}; TOTAL=${TOTAL:-64}; STEPS=${STEPS:-4}; VAL_EVERY=2; VAL_BATCHES=2
    EVAL_T=${EVAL_T:-128}; EVAL_BATCHES=2
    NIAH_LENGTHS="80,96"; NIAH_DEPTHS=2
    MAPS_T=32; GATES_T=32
    # the tiny model gains nothing from threads, and OpenMP's waiting threads cost seconds a step
    # on a machine whose cores are busy
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
    BIN=${BIN:-./train_fox}
    RESULTS=${RESULTS:-results/replicate}
    SIZE="--n_layer 6 --n_embd 384 --n_head 6"
    # 250 steps of 64 x 256 tokens: 4.1M tokens, 1.48 epochs of the 2.77M training tokens
    T=${T:-256}; B=${B:-64}; TOTAL=${TOTAL:-16384}; STEPS=${STEPS:-250}; VAL_EVERY=25; VAL_BATCHES=0
    EVAL_T=${EVAL_T:-8192}; EVAL_BATCHES=0
    # lengths 3/8 .. 8/8 of the training context (the easy prompt needs 66 tokens), 11 depths
    NIAH_LENGTHS=$(for k in 3 4 5 6 7 8; do printf '%d,' $((T * k / 8)); done); NIAH_LENGTHS=${NIAH_LENGTHS%,}
    NIAH_DEPTHS=11
    MAPS_T=512; GATES_T=512
fi
TRAIN_GLOB="$DATA_DIR/gutenberg_long_train_*.bin"
VAL_GLOB="$DATA_DIR/gutenberg_long_val_*.bin"
WARMUP=$((STEPS * TOTAL / 10)) # 10% of the tokens, as 256M of the paper's 2.7B
FINAL=$(printf "model_%08d.bin" "$STEPS")
FIRST_SEED=${SEEDS%% *}

say() { echo "replicate: $*"; }
need() { [ -e "$1" ] || { echo "error: $1 is missing. HINT: $2" >&2; exit 1; }; }
has_stage() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
is_fox() { case $1 in fox-*) return 0 ;; *) return 1 ;; esac; }
tokens_of() { # the token count of shards (header[2] of each)
    local n=0 f
    for f in "$@"; do n=$((n + $(od -An -t d4 -j 8 -N 4 "$f" | tr -d ' '))); done
    echo $n
}
# runs a command and appends the seconds it took to timings.csv: stage,model,lr,seed,seconds
timed() {
    local what=$1 start
    start=$(date +%s%N)
    shift
    "$@" || return
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '%s,%d.%03d\n' "$what" $((ms / 1000)) $((ms % 1000)) >> "$RESULTS/timings.csv"
}

mkdir -p "$RESULTS"
if has_stage data && ! ls $TRAIN_GLOB $VAL_GLOB >/dev/null 2>&1; then
    say "making the held-out split $DATA_DIR (sh data/prepare.sh long)"
    [ "$DATA_DIR" = data/gutenberg/long ] ||
        { echo "error: $DATA_DIR has no gutenberg_long shards. HINT: unset DATA_DIR to make them" >&2; exit 1; }
    make build/tokenize >/dev/null
    sh data/prepare.sh long
fi
for f in $TRAIN_GLOB $VAL_GLOB data/gpt2_tokenizer.bin; do
    need "$f" "run 'sh data/prepare.sh long' after 'make data' (or copy $DATA_DIR and data/gpt2_tokenizer.bin)"
done
# shellcheck disable=SC2086 # the globs name the shards
TRAIN_TOKENS=$(tokens_of $TRAIN_GLOB)
# shellcheck disable=SC2086
VAL_TOKENS=$(tokens_of $VAL_GLOB)
if [ "$MAKE_BIN" = 1 ] && { has_stage sweep || has_stage train || has_stage eval || has_stage niah ||
                            has_stage maps || has_stage gates; }; then
    make "${BIN#./}"
fi
touch "$RESULTS/timings.csv"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
case $BIN in *_cpu) GPU="CPU twin, ${OMP_NUM_THREADS:-$(nproc --all)} thread(s)" ;; esac
# what the report needs to know (rewritten by every invocation that trains or evaluates)
if has_stage sweep || has_stage train || has_stage eval || [ ! -e "$RESULTS/settings.env" ]; then
    cat > "$RESULTS/settings.env" <<EOF
MODELS=$MODELS
SEEDS=$SEEDS
LRS=$LRS
SIZE=$SIZE
T=$T
B=$B
TOTAL=$TOTAL
STEPS=$STEPS
EVAL_T=$EVAL_T
NIAH_LENGTHS=$NIAH_LENGTHS
NIAH_DEPTHS=$NIAH_DEPTHS
GATES_T=$GATES_T
TRAIN_TOKENS=$TRAIN_TOKENS
VAL_TOKENS=$VAL_TOKENS
DATA_DIR=$DATA_DIR
BIN=$BIN
DEVICE=${GPU:-unknown}
DATE=$(date -u +%Y-%m-%d)
CPU_SMOKE=${CPU_SMOKE:-0}
COMMAND=${REPLICATE_COMMAND:-$( [ "${CPU_SMOKE:-0}" = 1 ] && echo "CPU_SMOKE=1 dev/replicate.sh" || echo dev/replicate.sh)}
EOF
fi

run_dir() { echo "$RESULTS/runs/$1/lr$2_s$3"; }
final_loss() { { grep -h 'tel:' "$1/main.log" 2>/dev/null || true; } | tail -1 | sed 's/.*tel:\([^ ]*\).*/\1/'; }

# trains model $1 at peak LR $2 with seed $3 into its run directory (resumes a partial run)
train_run() {
    local model=$1 lr=$2 seed=$3 dir
    dir=$(run_dir "$model" "$lr" "$seed")
    mkdir -p "$dir"
    if [ -e "$dir/$FINAL" ]; then
        say "$model lr $lr seed $seed: trained (val loss $(final_loss "$dir"))"
        return
    fi
    local resume=0
    ls "$dir"/model_*.bin >/dev/null 2>&1 && resume=1 # a model file marks a complete checkpoint
    say "$model lr $lr seed $seed: $STEPS steps of $TOTAL tokens at context $T (resume $resume)"
    if ! timed "train,$model,$lr,$seed" $BIN -e "$model-tiny" $SIZE -i "$TRAIN_GLOB" -j "$VAL_GLOB" -b $B -t $T \
        -d $TOTAL -x "$STEPS" -l "$lr" -u $WARMUP -v $VAL_EVERY -m $VAL_BATCHES -s 0 -n "$STEPS" -S "$seed" \
        -o "$dir" -y $resume >> "$dir/train.out" 2>&1; then
        tail -5 "$dir/train.out"
        return 1
    fi
    say "$model lr $lr seed $seed: val loss $(final_loss "$dir")"
}

# the peak LR of each model: LR if set, else the sweep's best (lr.csv: model,lr)
if has_stage sweep; then
    if [ -n "${LR:-}" ]; then
        say "LR=$LR: no sweep"
        { echo "model,lr"; for model in $MODELS; do echo "$model,$LR"; done; } > "$RESULTS/lr.csv"
    else
        for model in $MODELS; do
            for lr in $LRS; do # a run that fails (diverges: -G stop) is left out of the choice
                train_run "$model" "$lr" "$FIRST_SEED" || say "$model lr $lr: failed, left out of the sweep"
            done
        done
        {
            echo "model,lr,seed,val_loss"
            for model in $MODELS; do
                for lr in $LRS; do
                    dir=$(run_dir "$model" "$lr" "$FIRST_SEED")
                    loss=nan
                    [ -e "$dir/$FINAL" ] && loss=$(final_loss "$dir")
                    echo "$model,$lr,$FIRST_SEED,$loss"
                done
            done
        } > "$RESULTS/sweep.csv"
        # the lowest final validation loss of each model (a non-finite loss never wins)
        awk -F, 'NR > 1 && $4 + 0 == $4 && (!($1 in best) || $4 < best[$1]) { best[$1] = $4; lr[$1] = $2 }
                 END { print "model,lr"; for (m in lr) print m "," lr[m] }' "$RESULTS/sweep.csv" > "$RESULTS/lr.csv"
        say "learning rates: $(tail -n +2 "$RESULTS/lr.csv" | tr '\n' ' ')"
    fi
fi
lr_of() {
    local lr
    lr=$(awk -F, -v m="$1" '$1 == m { print $2 }' "$RESULTS/lr.csv" 2>/dev/null || true)
    [ -n "$lr" ] || { echo "error: no learning rate for $1 in $RESULTS/lr.csv. HINT: run the sweep stage" \
                           "(STAGES=sweep) or set LR" >&2; exit 1; }
    echo "$lr"
}

if has_stage train; then
    for model in $MODELS; do
        lr=$(lr_of "$model")
        for seed in $SEEDS; do train_run "$model" "$lr" "$seed" || exit 1; done
    done
fi

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

# runs an evaluation mode of a trained run unless its output exists: stage, model, lr, seed, output, args
evaluate() {
    local stage=$1 model=$2 lr=$3 seed=$4 out=$5 dir
    shift 5
    dir=$(run_dir "$model" "$lr" "$seed")
    [ -e "$dir/$out" ] && return
    need "$dir/$FINAL" "train it first (STAGES=\"sweep train\")"
    timed "$stage,$model,$lr,$seed" $BIN -e "$dir/$FINAL" -j "$VAL_GLOB" "$@" > "$dir/$stage.out" 2>&1 ||
        { tail -5 "$dir/$stage.out"; exit 1; }
}

EVAL_MODELS=""
if has_stage eval || has_stage niah || has_stage maps || has_stage gates; then EVAL_MODELS=$MODELS; fi
for model in $EVAL_MODELS; do
    lr=$(lr_of "$model")
    for seed in $SEEDS; do
        dir=$(run_dir "$model" "$lr" "$seed")
        if has_stage eval; then
            evaluate eval "$model" "$lr" "$seed" eval.ppl.csv -M eval -t $EVAL_T -b 1 -m $EVAL_BATCHES -O "$dir/eval"
            say "$model seed $seed: P($T) $(awk -F, -v l=$T '$1 == l { print $2 }' "$dir/eval.ppl.csv")," \
                "P($EVAL_T) $(awk -F, -v l=$EVAL_T '$1 == l { print $2 }' "$dir/eval.ppl.csv")"
        fi
        if has_stage niah; then
            evaluate niah "$model" "$lr" "$seed" eval.niah.csv -M niah -D "$NIAH_LENGTHS" -E $NIAH_DEPTHS -O "$dir/eval"
        fi
        if has_stage maps && [ "$seed" = "$FIRST_SEED" ]; then
            evaluate maps "$model" "$lr" "$seed" eval.maps.bin -M maps -t $MAPS_T -D "$(maps_heads $(layers_heads))" \
                -O "$dir/eval"
        fi
        if has_stage gates && is_fox "$model" && [ ! -e "$dir/gates.csv" ]; then
            # F of every head on GATES_T held-out tokens; F_(i,i-1) = f_i, the gate at token i
            evaluate gates "$model" "$lr" "$seed" gates.maps.bin -M maps -t $GATES_T -O "$dir/gates"
            $PYTHON dev/replicate_report.py gates "$dir/gates.maps.bin" "$dir/gates.csv"
            rm -f "$dir/gates.maps.bin"
        fi
    done
done

runs_of() { # the run directories of a model, one per seed, comma-separated
    local lr dirs=""
    lr=$(lr_of "$1")
    for seed in $SEEDS; do dirs="$dirs,$(run_dir "$1" "$lr" "$seed")"; done
    echo "${dirs#,}"
}

if has_stage report; then
    $PYTHON dev/replicate_report.py report "$RESULTS" > /dev/null
    say "results ($RESULTS/results.md):"
    sed -n '/^## The four models/,/^## /p' "$RESULTS/results.md" | grep '^|' || true
fi

if has_stage plots; then
    if ! $PYTHON -c "import matplotlib, numpy" 2>/dev/null; then
        say "plots skipped: $PYTHON has no matplotlib or numpy. HINT: apt-get install python3-matplotlib, or copy" \
            "$RESULTS to a machine that has them and run STAGES=plots dev/replicate.sh there"
        exit 0
    fi
    loss_runs="" niah_runs="" gate_runs=""
    for model in $MODELS; do
        prefixes=$(runs_of "$model" | sed 's|\([^,]*\)|\1/eval|g')
        lr=$(lr_of "$model")
        first=$(run_dir "$model" "$lr" "$FIRST_SEED")
        [ -e "$first/eval.ppl.csv" ] && loss_runs="$loss_runs $model:$prefixes"
        [ -e "$first/eval.niah.csv" ] && niah_runs="$niah_runs $model:$prefixes"
        [ -e "$first/gates.csv" ] && gate_runs="$gate_runs $model:$(runs_of "$model" | sed 's|\([^,]*\)|\1/gates.csv|g')"
        [ -e "$first/eval.maps.bin" ] &&
            $PYTHON dev/plot_maps.py --max-maps 6 -o "$RESULTS/maps_$model.png" "$first/eval.maps.bin"
    done
    if [ -n "$loss_runs" ]; then
        $PYTHON dev/plot_loss.py --train-context $T --log-x -o "$RESULTS/loss.png" $loss_runs
    fi
    if [ -n "$niah_runs" ]; then
        $PYTHON dev/plot_niah.py --modes easy --score logprob --train-context $T -o "$RESULTS/niah.png" $niah_runs
    fi
    if [ -n "$gate_runs" ]; then
        $PYTHON dev/plot_gates.py --train-context $T -o "$RESULTS/gates.png" $gate_runs
    fi
    say "plots in $RESULTS"
fi
