#!/usr/bin/env python3
"""
Per-token loss and perplexity plots of `train_fox -M eval` results, as in the paper's figures.

    python3 dev/plot_loss.py -o loss.png --train-context 2048 run_a:out/fox run_b:out/transformer

Each argument is LABEL:PREFIX (or just PREFIX, labelled by its file name), where PREFIX.loss.csv
(position,loss) and PREFIX.ppl.csv (context,perplexity,...) were written by -M eval -O PREFIX.
Left: L(i) smoothed by a centred moving average over 101 tokens (shorter windows at the ends).
Right: P(l) = exp(mean_{i<=l} L(i)) at powers of two, log-scaled l. The training context is
marked with a dashed line on both.
"""
import argparse
import csv
import os
import sys

import numpy as np


def read_csv(path, columns):
    if not os.path.exists(path):
        sys.exit(f"error: {path} is missing\nHINT: write it with train_fox -M eval -O <prefix>")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or any(c not in rows[0] for c in columns):
        sys.exit(f"error: {path} has no rows or lacks the columns {columns}\nHINT: pass a prefix written by -M eval")
    return [np.array([float(r[c]) for r in rows]) for c in columns]


def smooth(values, window):
    """centred moving average; near the ends the window shrinks to what exists"""
    half = window // 2
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(len(values))
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + half + 1, len(values))
    return (csum[hi] - csum[lo]) / (hi - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL:PREFIX or PREFIX of -M eval outputs")
    ap.add_argument("-o", "--out", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--train-context", type=int, default=0, help="training context length to mark (0 = none)")
    ap.add_argument("--window", type=int, default=101, help="smoothing window in tokens (default 101)")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_p) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in args.runs:
        label, prefix = run.split(":", 1) if ":" in run else (os.path.basename(run), run)
        pos, loss = read_csv(prefix + ".loss.csv", ["position", "loss"])
        ctx, ppl = read_csv(prefix + ".ppl.csv", ["context", "perplexity"])
        ax_l.plot(pos, smooth(loss, args.window), label=label, linewidth=1.2)
        ax_p.plot(ctx, ppl, marker="o", markersize=3, label=label)
    for ax in (ax_l, ax_p):
        if args.train_context > 0:
            ax.axvline(args.train_context, color="gray", linestyle="--", linewidth=1, label="training context")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_l.set_xlabel("token position i")
    ax_l.set_ylabel(f"loss L(i), moving average over {args.window} tokens")
    ax_l.set_title("per-token loss")
    ax_p.set_xscale("log", base=2)
    low, high = ax_p.get_ylim()
    if low > 0 and high / low > 10:  # runs far apart (e.g. an untrained model): log scale
        ax_p.set_yscale("log")
    ax_p.set_xlabel("context length l")
    ax_p.set_ylabel("perplexity P(l)")
    ax_p.set_title("P(l) = exp(mean of L(1..l))")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
