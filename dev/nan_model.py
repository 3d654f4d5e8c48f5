#!/usr/bin/env python3
"""
A model file whose training diverges at once, for the step guard's tests: the final norm's first scale set to NaN
(every logit, the loss and the gradients turn NaN), the file's checksum (XXH64 of all bytes before its last 8, as
train_fox.c's checksum_digest) made to match again, so the trainer loads it and its guard must stop or skip.

    python3 dev/nan_model.py <model file> <out>
"""
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)
rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
rnd = lambda acc, x: rotl((acc + x * P2) & M, 31) * P1 & M


def xxh64(b):
    """XXH64 with seed 0 of bytes b"""
    n, i = len(b), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        while i + 32 <= n:
            v = [rnd(v[j], struct.unpack_from("<Q", b, i + 8 * j)[0]) for j in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", b, i)[0]), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", b, i)[0] * P1 & M), 23) * P2 + P3) & M
        i += 4
    for c in b[i:]:
        h = rotl(h ^ (c * P5 & M), 11) * P1 & M
    h = (h ^ (h >> 33)) * P2 & M
    h = (h ^ (h >> 29)) * P3 & M
    return h ^ (h >> 32)


def fail(message, hint):
    sys.exit(f"error: {message}\nHINT: {hint}")


def main():
    if len(sys.argv) != 3:
        fail("expected a model file and an output path", "python3 dev/nan_model.py <model file> <out>")
    try:
        data = bytearray(open(sys.argv[1], "rb").read())
    except OSError as e:
        fail(f"cannot read {sys.argv[1]}: {e.strerror}", "pass a model_*.bin that train_fox wrote")
    if len(data) < 1032 or xxh64(bytes(data[:-8])) != struct.unpack_from("<Q", data, len(data) - 8)[0]:
        fail(f"{sys.argv[1]} is not a checksummed model file", "pass a model_*.bin that train_fox wrote")
    h = struct.unpack_from("<256i", data)
    C, Vp = h[3], h[6]
    norm_f = len(data) - 8 - 4 * (Vp * C + C) # norm_f (C) sits just before lm_head (Vp, C), then the checksum
    struct.pack_into("<f", data, norm_f, float("nan"))
    struct.pack_into("<Q", data, len(data) - 8, xxh64(bytes(data[:-8])))
    open(sys.argv[2], "wb").write(data)


if __name__ == "__main__":
    main()
