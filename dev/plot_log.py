#!/usr/bin/env python3
"""
Training curves from train_fox's main.log, one or several runs side by side.

    python3 dev/plot_log.py -o curves.png log_gpu                      # a run directory or its main.log
    python3 dev/plot_log.py -o cmp.png fox:runs/fox transformer:runs/tr # LABEL:PATH, several runs

main.log holds one line per optimizer step and one per validation, llm.c's format with fields added:
    s:<step> trl:<train loss> [skip:<skipped so far>] lr:<lr> norm:<grad norm> tokps:<tokens/s> tokens:<seen>
    s:<step> tel:<val loss> tokens:<seen>
(`tokens` is what the model has trained on after <step> steps). Older logs have only the loss fields;
the panels they cannot fill say so. Unknown fields are ignored, so llm.c's own logs plot too.

The figure: train loss (raw, and smoothed by an exponential moving average, --smooth) with the
validation loss, the gradient norm, the learning rate and tokens/s; the top row against steps, the
bottom row against tokens seen. --dump prints the parsed values instead of plotting (one line per
record, the fields in log order), which the tests compare with the log itself.
"""
import argparse
import os
import sys

FIELDS = ("trl", "tel", "skip", "lr", "norm", "tokps", "tokens")


def fail(message, hint):
    sys.exit(f"error: {message}\nHINT: {hint}")


def parse_log(path):
    """Records of one main.log: dicts with 'line', 's' and the fields present (floats)."""
    if os.path.isdir(path):
        path = os.path.join(path, "main.log")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}", "pass a run directory (-o of train_fox) or its main.log")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = {"line": n}
        for part in line.split():
            key, sep, value = part.partition(":")
            if not sep:
                fail(f"{path}:{n}: '{part}' is not key:value", "main.log lines look like 's:10 trl:5.1234'")
            if key == "s" or key in FIELDS:
                try:
                    rec[key] = int(value) if key in ("s", "skip", "tokens") else float(value)
                except ValueError:
                    fail(f"{path}:{n}: {key} has the value '{value}', not a number", "is the file a train_fox main.log?")
        if "s" not in rec or ("trl" not in rec and "tel" not in rec):
            fail(f"{path}:{n}: no step (s:) with a train (trl:) or validation (tel:) loss",
                 "is the file a train_fox main.log?")
        records.append(rec)
    if not records:
        fail(f"{path} has no step lines", "the run has not finished a step yet")
    return path, records


def series(records, kind, key):
    """(steps, tokens, values) of one field over the records of one kind ('trl' or 'tel')."""
    rows = [r for r in records if kind in r and key in r]
    steps = [r["s"] for r in rows]
    tokens = [r.get("tokens") for r in rows]
    return steps, tokens, [r[key] for r in rows]


def ema(values, alpha):
    out, m = [], None
    for v in values:
        m = v if m is None else alpha * m + (1 - alpha) * v
        out.append(m)
    return out


def dump(label, records):
    for r in records:
        fields = " ".join(f"{k}:{r[k]}" for k in FIELDS if k in r)
        print(f"{label} s:{r['s']} {fields}")


def plot(runs, out, alpha):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("loss", "trl"), ("grad norm", "norm"), ("learning rate", "lr"), ("tokens/s", "tokps")]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.5), squeeze=False)
    for row, xname in enumerate(("step", "tokens seen")):
        for col, (title, key) in enumerate(panels):
            ax = axes[row][col]
            drawn = False
            for i, (label, records) in enumerate(runs):
                color = f"C{i}"
                steps, tokens, values = series(records, "trl", key)
                xs = steps if row == 0 else tokens
                if values and all(x is not None for x in xs):
                    if key == "trl":
                        ax.plot(xs, values, color=color, alpha=0.25, linewidth=0.8)
                        ax.plot(xs, ema(values, alpha), color=color, linewidth=1.5, label=f"{label} train")
                    else:
                        ax.plot(xs, values, color=color, linewidth=1.2, label=label)
                    drawn = True
                if key == "trl":
                    vsteps, vtokens, vvalues = series(records, "tel", "tel")
                    vx = vsteps if row == 0 else vtokens
                    if vvalues and all(x is not None for x in vx):
                        ax.plot(vx, vvalues, color=color, marker="o", markersize=3, linestyle="--",
                                label=f"{label} val")
                        drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_title(title)
            ax.set_xlabel(xname)
            ax.grid(alpha=0.3)
            if key == "lr":
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
            if drawn and col == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="PATH or LABEL:PATH, PATH a run directory or a main.log")
    ap.add_argument("-o", "--out", default="curves.png", help="PNG to write (default curves.png)")
    ap.add_argument("--smooth", type=float, default=0.9, help="EMA factor for the train loss, 0 <= a < 1 (default 0.9)")
    ap.add_argument("--dump", action="store_true", help="print the parsed records instead of plotting")
    args = ap.parse_args()
    if not 0 <= args.smooth < 1:
        fail(f"--smooth {args.smooth} is outside [0, 1)", "0 keeps the raw loss, 0.9-0.99 smooths it")
    runs = []
    for spec in args.runs:
        label, path = spec.split(":", 1) if ":" in spec and not os.path.exists(spec) else (None, spec)
        path, records = parse_log(path)
        if label is None:
            label = os.path.basename(os.path.dirname(os.path.abspath(path))) if path.endswith("main.log") else path
        runs.append((label, records))
    if args.dump:
        for label, records in runs:
            dump(label, records)
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        fail("matplotlib is not installed", "apt-get install python3-matplotlib (or pip install matplotlib)")
    plot(runs, args.out, args.smooth)


if __name__ == "__main__":
    main()
