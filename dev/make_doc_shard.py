#!/usr/bin/env python3
"""
Writes a synthetic token shard of short documents, for timing train_fox with documents kept apart (-f 1)
against the same data without it. llm.c's shard format (as train_fox reads it): a header of 256 int32 (magic
20240520, version 1, the token count), then the tokens as uint16. Each document is the EOT token 50256 followed
by random token ids below it, its length (EOT included) uniform in [--min, --max]; the last one is cut at the
count. Python's standard library only; the same --seed gives the same bytes.

  python3 dev/make_doc_shard.py -o data/docs/docs_train_000000.bin -n 8388608
  python3 dev/make_doc_shard.py -o data/docs/docs_val_000000.bin -n 1048576 --seed 2

The benchmark (fox-pro-125m at 2 x 16384 on a GPU, -A 1 with -f 0 and -f 1: step times and "pruned" shares) makes
these two shards itself: dev/bench_documents.sh
"""
import argparse
import array
import os
import random
import sys

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
EOT = 50256  # GPT-2's end-of-text token: a document's first token


def fail(msg, hint):
    print(f"error: {msg}\nHINT: {hint}", file=sys.stderr)
    sys.exit(1)


def document_tokens(count, lo, hi, seed):
    # count uint16 tokens: documents of lo..hi tokens, each an EOT then ids in [0, EOT)
    rng = random.Random(seed)
    tokens = array.array("H")
    while len(tokens) < count:
        n = min(rng.randint(lo, hi), count - len(tokens))
        tokens.append(EOT)
        tokens.extend(rng.randrange(EOT) for _ in range(n - 1))
    return tokens


def write_shard(path, tokens):
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    if sys.byteorder != "little":  # the format is little-endian
        header.byteswap()
        tokens.byteswap()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        header.tofile(f)
        tokens.tofile(f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description="synthetic shard of short EOT-separated documents (llm.c format)")
    p.add_argument("-o", "--out", required=True, help="the shard to write")
    p.add_argument("-n", "--tokens", type=int, default=8 << 20, help="tokens in the shard (default 8388608)")
    p.add_argument("--min", type=int, default=512, help="shortest document, EOT included (default 512)")
    p.add_argument("--max", type=int, default=2048, help="longest document, EOT included (default 2048)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    a = p.parse_args()
    if not 1 <= a.tokens <= 2**31 - 1:
        fail(f"-n {a.tokens} is outside [1, 2^31 - 1]", "a shard's header holds the count as an int32")
    if not 1 <= a.min <= a.max:
        fail(f"--min {a.min} --max {a.max}: need 1 <= min <= max", "e.g. --min 512 --max 2048")
    tokens = document_tokens(a.tokens, a.min, a.max, a.seed)
    docs = tokens.count(EOT)
    write_shard(a.out, tokens)
    print(f"wrote {a.out}: {len(tokens)} tokens, {docs} documents (mean {len(tokens) / docs:.0f} tokens)")


if __name__ == "__main__":
    main()
