#!/usr/bin/env bash
# Runs the fuzz harnesses built by the Makefile (build/fuzz/fuzz_<reader>).
#   run.sh fuzz <seconds> <reader>...   fuzz each reader for a fixed time from its seeds
#                                       (build/fuzz/seeds/<reader>, dev/fuzz/seeds/<reader>)
#                                       and its past crashes (dev/fuzz/regressions/<reader>);
#                                       a new crash is copied into dev/fuzz/regressions/<reader>
#   run.sh regressions <reader>...      replay every input in dev/fuzz/regressions/<reader>
set -uo pipefail
cd "$(dirname "$0")/../.."
# a failed allocation returns NULL, which the readers report, instead of ending the run
export ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=256
export UBSAN_OPTIONS=print_stacktrace=1
mode=$1; shift
failed=()
if [ "$mode" = fuzz ]; then
    seconds=$1; shift
    for r in "$@"; do
        corpus=build/fuzz/corpus/$r crashes=build/fuzz/crashes/$r
        mkdir -p "$corpus" "$crashes"
        dirs=()
        for d in build/fuzz/seeds/$r dev/fuzz/seeds/$r dev/fuzz/regressions/$r; do [ -d "$d" ] && dirs+=("$d"); done
        log=build/fuzz/$r.log
        if build/fuzz/fuzz_$r -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
               -artifact_prefix="$crashes/" "$corpus" "${dirs[@]}" > "$log" 2>&1; then
            echo "fuzz $r: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') inputs in ${seconds} s, no crash (corpus $(ls "$corpus" | wc -l) inputs)"
        else
            mkdir -p dev/fuzz/regressions/$r
            cp "$crashes"/* dev/fuzz/regressions/$r/ 2>/dev/null
            echo "fuzz $r: CRASH, see $log; the input is kept in dev/fuzz/regressions/$r"
            grep -m3 -E 'ERROR|SUMMARY|runtime error' "$log"
            failed+=("$r")
        fi
    done
elif [ "$mode" = regressions ]; then
    for r in "$@"; do
        inputs=(dev/fuzz/regressions/$r/*)
        [ -e "${inputs[0]}" ] || continue
        if build/fuzz/fuzz_$r "${inputs[@]}" > build/fuzz/$r.regressions.log 2>&1; then
            echo "fuzz-regressions $r: ${#inputs[@]} past crash input(s) read without a crash"
        else
            echo "fuzz-regressions $r: CRASH, see build/fuzz/$r.regressions.log"
            failed+=("$r")
        fi
    done
else
    echo "usage: run.sh fuzz <seconds> <reader>... | run.sh regressions <reader>..."; exit 2
fi
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
