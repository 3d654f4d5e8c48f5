#!/usr/bin/env python3
"""
Needle-in-a-haystack heatmaps of `train_fox -M niah` results, in the style of the paper's
appendix: context length on x, needle depth on y, one panel per mode (standard, easy).

    python3 dev/plot_niah.py -o niah.png --train-context 2048 fox:out/fox transformer:out/transformer

Each argument is LABEL:PREFIX (or PREFIX), PREFIX.niah.csv written by -M niah -O PREFIX; one row
of panels per run, one panel per mode of --modes (default standard,easy). LABEL:PREFIX,PREFIX,...
(runs of one model, e.g. seeds) draws the mean of their cells. --score picks the colour: `greedy`
(default) is the fraction of the answer's tokens that greedy decoding reproduces before its first
miss (1 = the whole answer), `prob` is the answer's per-token probability exp(log p(answer) /
answer tokens); both lie in [0, 1] and the colour map runs red (0) to green (1) as in the paper.
`logprob` is log p(answer) itself (nats), on one colour scale from the lowest to the highest cell.
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
    """the mean score of each (depth, context) cell over the rows (of one or more runs)"""
    rows = [r for r in rows if r["mode"] == mode]
    contexts = sorted({int(r["context"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    total = np.zeros((len(depths), len(contexts)))
    count = np.zeros((len(depths), len(contexts)))
    for r in rows:
        n = int(r["answer_tokens"])
        if score == "greedy":
            v = int(r["greedy_tokens"]) / n
        elif score == "prob":
            v = float(np.exp(float(r["answer_logprob"]) / n))
        else:
            v = float(r["answer_logprob"])
        cell = depths.index(float(r["depth"])), contexts.index(int(r["context"]))
        total[cell] += v
        count[cell] += 1
    with np.errstate(invalid="ignore"):
        return contexts, depths, np.where(count > 0, total / np.maximum(count, 1), np.nan)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL:PREFIX or PREFIX of -M niah outputs")
    ap.add_argument("-o", "--out", default="niah.png", help="PNG to write (default niah.png)")
    ap.add_argument("--score", choices=["greedy", "prob", "logprob"], default="greedy")
    ap.add_argument("--modes", default="standard,easy", help="panels per run (default standard,easy)")
    ap.add_argument("--train-context", type=int, default=0, help="training context length to mark (0 = none)")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("standard", "easy") for m in modes):
        sys.exit(f"error: --modes {args.modes}\nHINT: standard, easy or standard,easy")
    panels = []
    for run in args.runs:
        label, prefixes = run.split(":", 1) if ":" in run else (os.path.basename(run), run)
        prefixes = prefixes.split(",")
        rows = [r for p in prefixes for r in read_niah(p + ".niah.csv")]
        if len(prefixes) > 1:
            label = f"{label} (mean of {len(prefixes)} runs)"
        panels.append([(label, mode, *grid(rows, mode, args.score)) for mode in modes])
    vmin, vmax = 0.0, 1.0
    if args.score == "logprob":
        finite = [z[np.isfinite(z)] for row in panels for (*_, z) in row]
        finite = np.concatenate(finite) if finite else np.array([])
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 0.0)
    # one mode: two runs a row; the log p scale is not a success scale, so not red to green
    flat = [p for row in panels for p in row]
    cols = len(modes) if len(modes) > 1 else min(2, len(flat))
    nrows = (len(flat) + cols - 1) // cols
    cmap = "viridis" if args.score == "logprob" else "RdYlGn"
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(flat):]:
        ax.axis("off")
    for i, (label, mode, contexts, depths, z) in enumerate(flat):
        ax = axes.flat[i]
        im = ax.imshow(z, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="upper")
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
        what = {"greedy": "greedy", "prob": "p per token", "logprob": "log p(answer)"}[args.score]
        ax.set_title(f"{label}, {mode} mode ({what}, mean {mean:.2f})", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
