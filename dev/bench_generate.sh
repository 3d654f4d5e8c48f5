#!/usr/bin/env bash
# Generation speed on one GPU: train_fox's paged KV cache with one CUDA graph per token against the
# full forward for every token (a train_fox built before the GPU decoder existed, BASE=...), for
# fox-pro-125m after prompts of 2k, 8k and 32k tokens and fox-pro-760m after 8k, batch 1, with and
# without -A 1 (eviction), and 32 prompts of 2k at once. Greedy (-T 0), 64 new tokens per prompt,
# the prompts the first tokens of the held-out shard; the weights are the presets' random init, or a
# trained checkpoint's (MODEL=path/model_*.bin, BIG= to skip the 760m runs).
# Prints one line per run (ms per generated token, or tokens/s for a batch) and keeps each run's
# output in $OUT. A benchmark, not a test: every run's exit status is printed, none is judged.
#
#   make train_fox && dev/bench_generate.sh                       # the GPU decoder alone
#   BASE=/path/to/old/train_fox dev/bench_generate.sh             # and the full recompute beside it
#   MODEL=run/model_00000500.bin BIG= dev/bench_generate.sh       # trained weights (eviction keeps more)
set -u
NEW=${NEW:-./train_fox}
BASE=${BASE:-}
OUT=${OUT:-bench_generate}
SHARD=${SHARD:-data/gutenberg/gutenberg_val_000000.bin}
GEN=${GEN:-64}
MODEL=${MODEL:-fox-pro-125m}
BIG=${BIG-fox-pro-760m}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
date -u +%Y-%m-%d

# run NAME BINARY ARGS...: one -M generate, its timing line and the cache line
run() {
    local name=$1 bin=$2
    shift 2
    local t0 rc
    t0=$(date +%s%N)
    "$bin" -M generate -P "@$SHARD" -T 0 -g "$GEN" "$@" > "$OUT/$name.txt" 2>&1
    rc=$?
    local wall ms tps kv step
    wall=$(( ($(date +%s%N) - t0) / 1000000000 ))
    ms=$(grep -o 'then [0-9.]* ms per generated token' "$OUT/$name.txt" | grep -o '[0-9.]*' | head -1)
    tps=$(grep -o '[0-9]* generated tokens/s' "$OUT/$name.txt" | grep -o '^[0-9]*')
    step=$(grep -o 'then [0-9.]* ms per step' "$OUT/$name.txt" | grep -o '[0-9.]*' | head -1)
    kv=$(grep -o 'entries live ([0-9.]*%)' "$OUT/$name.txt" | head -1)
    printf '%-34s rc=%d  %s  %s  %s  (%s; %d s wall)\n' "$name" "$rc" "${ms:+$ms ms/token}" \
        "${step:+$step ms/step}" "${tps:+$tps tok/s}" "${kv:-no cache line}" "$wall"
}

# the greedy tokens of two runs of one prompt (the text between the --- lines)
same_tokens() {
    if cmp -s <(sed -n '/^---$/,/^---$/p' "$OUT/$1.txt") <(sed -n '/^---$/,/^---$/p' "$OUT/$2.txt"); then
        echo "  $1 and $2: the same $GEN greedy tokens"
    else
        echo "  $1 and $2: different greedy tokens"
    fi
}

for T in 2048 8192 32768; do
    P=$((T - GEN))
    run "125m_prompt${P}" "$NEW" -e "$MODEL" -t "$T"
    run "125m_prompt${P}_A1" "$NEW" -e "$MODEL" -t "$T" -A 1
    same_tokens "125m_prompt${P}" "125m_prompt${P}_A1"
    if [ -n "$BASE" ]; then
        run "125m_prompt${P}_full_recompute" "$BASE" -e "$MODEL" -t "$T"
        same_tokens "125m_prompt${P}" "125m_prompt${P}_full_recompute"
    fi
done
if [ -n "$BIG" ]; then
    run "760m_prompt8128" "$NEW" -e "$BIG" -t 8192
    run "760m_prompt8128_A1" "$NEW" -e "$BIG" -t 8192 -A 1
    if [ -n "$BASE" ]; then run "760m_prompt8128_full_recompute" "$BASE" -e "$BIG" -t 8192; fi
fi
run "125m_32x1984" "$NEW" -e "$MODEL" -t 2048 -D '1984*32'
run "125m_32x1984_A1" "$NEW" -e "$MODEL" -t 2048 -D '1984*32' -A 1
