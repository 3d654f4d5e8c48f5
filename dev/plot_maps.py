#!/usr/bin/env python3
"""
Forget-gate and attention maps of `train_fox -M maps`, in the style of the paper's figures.

    python3 dev/plot_maps.py -o maps.png out/fox.maps.bin [--max-maps 8]

The file (written by -M maps -O PREFIX as PREFIX.maps.bin): int32 header[256] = magic 20261121,
version 1, T, number of maps, window; then per map int32 layer, int32 head, F (T, T) fp32 and
A (T, T) fp32, rows = queries. One row of panels per map: F = exp(c_i - c_j) on the lower
triangle (1 where nothing is forgotten), and A with only the entries above 0.1 shown, as in the
paper.
"""
import argparse
import os
import sys

import numpy as np

MAGIC = 20261121


def read_maps(path):
    if not os.path.exists(path):
        sys.exit(f"error: {path} is missing\nHINT: write it with train_fox -M maps -O <prefix>")
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    if len(raw) < 1024 or header[0] != MAGIC or header[1] != 1:
        sys.exit(f"error: {path} is not a version-1 maps file\nHINT: pass the .maps.bin written by -M maps")
    T, n, window = int(header[2]), int(header[3]), int(header[4])
    per = 8 + 2 * 4 * T * T
    if len(raw) != 1024 + n * per:
        sys.exit(f"error: {path} is {len(raw)} bytes, expected {1024 + n * per}\nHINT: the file is truncated")
    maps = []
    for i in range(n):
        base = 1024 + i * per
        layer, head = (int(x) for x in raw[base:base + 8].view(np.int32))
        F = raw[base + 8:base + 8 + 4 * T * T].view(np.float32).reshape(T, T)
        A = raw[base + 8 + 4 * T * T:base + per].view(np.float32).reshape(T, T)
        maps.append((layer, head, F, A))
    return T, window, maps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("maps", help="a .maps.bin written by -M maps")
    ap.add_argument("-o", "--out", default="maps.png", help="PNG to write (default maps.png)")
    ap.add_argument("--max-maps", type=int, default=12, help="draw at most this many maps (default 12)")
    ap.add_argument("--threshold", type=float, default=0.1, help="A entries at or below it are blank (default 0.1)")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, window, maps = read_maps(args.maps)
    maps = maps[:args.max_maps]
    fig, axes = plt.subplots(len(maps), 2, figsize=(8, 3.8 * len(maps)), squeeze=False)
    for i, (layer, head, F, A) in enumerate(maps):
        lower = np.tril(np.ones((T, T), dtype=bool))
        Fm = np.ma.masked_where(~lower, F)
        im = axes[i][0].imshow(Fm, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        axes[i][0].set_title(f"layer {layer} head {head}: forget gate F", fontsize=9)
        fig.colorbar(im, ax=axes[i][0], fraction=0.046, pad=0.02)
        Am = np.ma.masked_where(A <= args.threshold, A)
        im = axes[i][1].imshow(Am, cmap="viridis", vmin=args.threshold, vmax=1, interpolation="nearest")
        axes[i][1].set_title(f"layer {layer} head {head}: attention A > {args.threshold}", fontsize=9)
        fig.colorbar(im, ax=axes[i][1], fraction=0.046, pad=0.02)
        for ax in axes[i]:
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({len(maps)} maps of {T} tokens{', window %d' % window if window else ''})")


if __name__ == "__main__":
    main()
