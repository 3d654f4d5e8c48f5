#!/usr/bin/env python3
"""
Per-token loss and perplexity plots of `train_fox -M eval` results, as in the paper's figures.

    python3 dev/plot_loss.py -o loss.png --train-context 2048 run_a:out/fox run_b:out/transformer
    python3 dev/plot_loss.py -o loss.png --train-context 256 --log-x fox:s1/eval,s2/eval,s3/eval

Each argument is LABEL:PREFIX (or just PREFIX, labelled by its file name), where PREFIX.loss.csv
(position,loss) and PREFIX.ppl.csv (context,perplexity,...) were written by -M eval -O PREFIX.
LABEL:PREFIX,PREFIX,... are runs of one model (seeds): their mean is drawn, with the band from
their smallest to their largest value (P(l): error bars).
Left: L(i) smoothed by a centred moving average over 101 tokens (shorter windows at the ends;
with --log-x, at most 10% of the position either side, so the first tokens stay sharp).
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


def smooth(values, window, relative=False):
    """centred moving average; near the ends the window shrinks to what exists; relative: at most
    10% of the position either side"""
    half = np.full(len(values), window // 2)
    idx = np.arange(len(values))
    if relative:
        half = np.minimum(half, (0.1 * (idx + 1)).astype(int))
    csum = np.concatenate([[0.0], np.cumsum(values)])
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + half + 1, len(values))
    return (csum[hi] - csum[lo]) / (hi - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL:PREFIX or PREFIX of -M eval outputs")
    ap.add_argument("-o", "--out", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--train-context", type=int, default=0, help="training context length to mark (0 = none)")
    ap.add_argument("--window", type=int, default=101, help="smoothing window in tokens (default 101)")
    ap.add_argument("--log-x", action="store_true", help="log-scaled positions in the L(i) plot")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_p) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in args.runs:
        label, prefixes = run.split(":", 1) if ":" in run else (os.path.basename(run), run)
        prefixes = prefixes.split(",")
        curves, ppls = [], []
        for prefix in prefixes:
            pos, loss = read_csv(prefix + ".loss.csv", ["position", "loss"])
            ctx, ppl = read_csv(prefix + ".ppl.csv", ["context", "perplexity"])
            curves.append(smooth(loss, args.window, args.log_x))
            ppls.append(ppl)
        if len({len(c) for c in curves}) > 1 or len({len(p) for p in ppls}) > 1:
            sys.exit(f"error: the runs of {label} were evaluated at different lengths\n"
                     "HINT: evaluate every run of a label with the same -t")
        curves, ppls = np.array(curves), np.array(ppls)
        if len(prefixes) > 1:
            label = f"{label} ({len(prefixes)} runs)"
        line, = ax_l.plot(pos, curves.mean(axis=0), label=label, linewidth=1.2)
        mean_p = ppls.mean(axis=0)
        if len(prefixes) > 1:
            ax_l.fill_between(pos, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.25,
                              linewidth=0)
            ax_p.errorbar(ctx, mean_p, yerr=[mean_p - ppls.min(axis=0), ppls.max(axis=0) - mean_p], marker="o",
                          markersize=3, capsize=2, label=label, color=line.get_color())
        else:
            ax_p.plot(ctx, mean_p, marker="o", markersize=3, label=label, color=line.get_color())
    for ax in (ax_l, ax_p):
        if args.train_context > 0:
            ax.axvline(args.train_context, color="gray", linestyle="--", linewidth=1, label="training context")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_l.set_xlabel("token position i")
    if args.log_x:
        ax_l.set_xscale("log", base=2)
        ax_l.set_ylabel(f"loss L(i), moving average (<= {args.window} tokens, <= 20% of i)")
    else:
        ax_l.set_ylabel(f"loss L(i), moving average over {args.window} tokens")
    several = any("," in run.split(":", 1)[-1] for run in args.runs)
    ax_l.set_title("per-token loss" + (" (band: smallest to largest run)" if several else ""))
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
