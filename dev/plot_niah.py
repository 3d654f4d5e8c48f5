#!/usr/bin/env python3
"""
Needle-in-a-haystack heatmaps of `train_fox -M niah` results, in the style of the paper's
appendix: context length on x, needle depth on y, one panel per mode (standard, easy).

    python3 dev/plot_niah.py -o niah.png --train-context 2048 fox:out/fox transformer:out/transformer

Each argument is LABEL:PREFIX (or PREFIX), PREFIX.niah.csv written by -M niah -O PREFIX; one row
of panels per run. --score picks the colour: `greedy` (default) is the fraction of the answer's
tokens that greedy decoding reproduces before its first miss (1 = the whole answer), `prob` is
the answer's per-token probability exp(log p(answer) / answer tokens). Both lie in [0, 1]; the
colour map runs red (0) to green (1) as in the paper.
"""
import argparse
import csv
import os
import sys

import numpy as np


def read_niah(path):
    if not os.path.exists(path):
        sys.exit(f"error: {path} is missing\nHINT: write it with train_fox -M niah -O <prefix>")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = ["mode", "context", "depth", "answer_tokens", "answer_logprob", "greedy_tokens"]
    if not rows or any(c not in rows[0] for c in need):
        sys.exit(f"error: {path} has no rows or lacks the columns {need}\nHINT: pass a prefix written by -M niah")
    return rows


def grid(rows, mode, score):
    rows = [r for r in rows if r["mode"] == mode]
    contexts = sorted({int(r["context"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    z = np.full((len(depths), len(contexts)), np.nan)
    for r in rows:
        n = int(r["answer_tokens"])
        if score == "greedy":
            v = int(r["greedy_tokens"]) / n
        else:
            v = float(np.exp(float(r["answer_logprob"]) / n))
        z[depths.index(float(r["depth"])), contexts.index(int(r["context"]))] = v
    return contexts, depths, z


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL:PREFIX or PREFIX of -M niah outputs")
    ap.add_argument("-o", "--out", default="niah.png", help="PNG to write (default niah.png)")
    ap.add_argument("--score", choices=["greedy", "prob"], default="greedy")
    ap.add_argument("--train-context", type=int, default=0, help="training context length to mark (0 = none)")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["standard", "easy"]
    fig, axes = plt.subplots(len(args.runs), 2, figsize=(11, 3.6 * len(args.runs)), squeeze=False)
    for ri, run in enumerate(args.runs):
        label, prefix = run.split(":", 1) if ":" in run else (os.path.basename(run), run)
        rows = read_niah(prefix + ".niah.csv")
        for mi, mode in enumerate(modes):
            ax = axes[ri][mi]
            contexts, depths, z = grid(rows, mode, args.score)
            im = ax.imshow(z, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto", origin="upper")
            ax.set_xticks(range(len(contexts)))
            ax.set_xticklabels([str(c) for c in contexts], rotation=45, fontsize=7)
            ax.set_yticks(range(len(depths)))
            ax.set_yticklabels([f"{100 * d:.0f}%" for d in depths], fontsize=7)
            if args.train_context > 0 and contexts:
                # the boundary between the contexts within and beyond training
                inside = sum(1 for c in contexts if c <= args.train_context)
                if 0 < inside < len(contexts):
                    ax.axvline(inside - 0.5, color="black", linestyle="--", linewidth=1)
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth")
            mean = np.nanmean(z) if np.isfinite(z).any() else float("nan")
            ax.set_title(f"{label}, {mode} mode (mean {mean:.2f})", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
