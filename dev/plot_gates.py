#!/usr/bin/env python3
"""
How far each FoX head remembers: a per-layer histogram of the heads' mean decay lengths, from the
gates.csv files of dev/replicate.sh (dev/replicate_report.py gates: 1 / mean(-log f) of a head's
forget gates on held-out text, read off -M maps' F).

    python3 dev/plot_gates.py -o gates.png --train-context 256 fox-pro:s1/gates.csv,s2/gates.csv

Each argument is LABEL:CSV[,CSV...] (the runs of one model, e.g. seeds; their heads are pooled);
one panel per label. Each layer is a stacked bar: how many heads have a decay length in each
range, short (the head forgets within a few tokens) at the bottom, long (it keeps more than the
training context, dashed bin edge) at the top.
"""
import argparse
import csv
import math
import os
import sys

import numpy as np


def read_gates(path):
    if not os.path.exists(path):
        sys.exit(f"error: {path} is missing\nHINT: write it with dev/replicate_report.py gates <maps.bin> <csv>")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "decay_length" not in rows[0] or "layer" not in rows[0]:
        sys.exit(f"error: {path} has no rows or lacks layer,decay_length\nHINT: pass a gates.csv")
    return [(int(r["layer"]), float(r["decay_length"])) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL:CSV[,CSV...] of gates.csv files")
    ap.add_argument("-o", "--out", default="gates.png", help="PNG to write (default gates.png)")
    ap.add_argument("--train-context", type=int, default=256, help="the last bin edge: the training context")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = args.train_context
    edges = [0] + [e for e in (2, 4, 16, 64) if e < T] + [T, math.inf]
    names = [f"< {b}" if a == 0 else (f"> {a}" if b == math.inf else f"{a}-{b}") for a, b in zip(edges, edges[1:])]
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.95, len(names)))
    fig, axes = plt.subplots(1, len(args.runs), figsize=(5.2 * len(args.runs), 4), squeeze=False)
    for ax, run in zip(axes[0], args.runs):
        label, paths = run.split(":", 1) if ":" in run else (os.path.basename(run), run)
        heads = [h for p in paths.split(",") for h in read_gates(p)]
        layers = sorted({layer for layer, _ in heads})
        counts = np.zeros((len(names), len(layers)))
        for layer, length in heads:
            b = next(i for i in range(len(names)) if edges[i] <= length < edges[i + 1])
            counts[b, layers.index(layer)] += 1
        bottom = np.zeros(len(layers))
        for b in range(len(names)):
            ax.bar(layers, counts[b], bottom=bottom, color=colors[b], label=names[b], edgecolor="white", linewidth=0.5)
            bottom += counts[b]
        ax.set_xticks(layers)
        ax.set_xlabel("layer")
        ax.set_ylabel(f"heads ({len(paths.split(','))} runs pooled)")
        ax.set_title(f"{label}: mean decay length of each head (tokens)", fontsize=9)
    axes[0][-1].legend(fontsize=8, title="decay length", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
