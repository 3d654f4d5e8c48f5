#!/usr/bin/env bash
# Do two train_fox builds train the same bits? 20 steps of fox-pro-125m at 16 x 2048 and 2 x 16384, with
# and without pruning (-A 1), from each binary: the step lines of main.log (tokens/s left out) and the
# final model and state files must be equal byte for byte. For a change that must not move training
# (a refactor, a new option off by default). Files of two checkpoint formats (another version in the
# header) are compared by what follows the 1,024-byte header, over the shorter, less the checksum (its last 8
# bytes, which cover the header) when both have one.
#
#   dev/compare_bits.sh OLD_BINARY NEW_BINARY [work dir]     (about 3 minutes on one H200)
#   ONLY="16x2048_A0 2x16384_A1" dev/compare_bits.sh ...        (some of the four configurations)
#   EXTRA="-q hybrid" dev/compare_bits.sh ...                    (more flags for every run: FP8 steps)
#
# Needs the default shards (make data). Exit status: the number of configurations that differ.
set -u
cd "$(dirname "$0")/.." || exit 1
[ $# -ge 2 ] || { echo "usage: dev/compare_bits.sh OLD_BINARY NEW_BINARY [work dir]"; exit 2; }
OLD=$1 NEW=$2 WORK=${3:-out_compare_bits}
mkdir -p "$WORK"
differ=0
# two checkpoint files alike: byte for byte, or, when their versions (header slot 1) differ, past the header
# over the shorter, less the checksum when both have one
same_file() {
    local na nb
    na=$(stat -c %s "$1" 2>/dev/null) && nb=$(stat -c %s "$2" 2>/dev/null) || return 1
    cmp -s "$1" "$2" && return 0
    cmp -s -i 4 -n 4 "$1" "$2" && return 1
    local tail=8 # both end with a checksum; sizes 8 apart: the shorter is from before checksums
    [ "$na" = "$nb" ] || tail=0
    [ "$na" -lt "$nb" ] || na=$nb
    cmp -s -i 1024 -n $((na - 1024 - tail)) "$1" "$2"
}
for shape in "16 2048" "2 16384"; do
    set -- $shape
    for prune in 0 1; do
        name=${1}x${2}_A$prune
        [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || continue
        for which in old new; do
            bin=$OLD; [ $which = new ] && bin=$NEW
            dir=$WORK/${name}_$which
            rm -rf "$dir"
            if ! "$bin" -e fox-pro-125m -b "$1" -t "$2" -x 20 -v 0 -s 0 -n 20 -A $prune ${EXTRA:-} -o "$dir" \
                > "$dir.out" 2>&1; then
                echo "FAIL $name: $bin did not finish (see $dir.out)"; differ=$((differ + 1)); continue 2
            fi
            grep '^s:' "$dir/main.log" | sed 's/ tokps:[0-9.]*//' > "$dir/steps.txt"
        done
        a=$WORK/${name}_old b=$WORK/${name}_new
        if cmp -s "$a/steps.txt" "$b/steps.txt" && same_file "$a/model_00000020.bin" "$b/model_00000020.bin" &&
           same_file "$a/state_00000020.bin" "$b/state_00000020.bin"; then
            echo "same $name: $(wc -l < "$a/steps.txt") steps, model and state files equal ($(tail -n 1 "$a/steps.txt"))"
        else
            echo "DIFFER $name:"; diff "$a/steps.txt" "$b/steps.txt" | head -n 4; differ=$((differ + 1))
        fi
    done
done
exit $differ
