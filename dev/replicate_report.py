#!/usr/bin/env python3
"""
The numbers of dev/replicate.sh (standard library only, so it runs wherever the script does).

    python3 dev/replicate_report.py gates RUN/gates.maps.bin RUN/gates.csv
    python3 dev/replicate_report.py report RESULTS          # writes RESULTS/results.md

gates: every head's forget gate from a -M maps file of all heads. F_(i,i-1) = exp(c_i - c_(i-1))
= f_i, the gate at token i, so the sub-diagonal of F holds the head's gates on the map's tokens.
The mean decay length of a head is 1 / mean_i(-log f_i): the distance over which F falls by e
when every gate is the geometric mean (F_(i,j) ~ exp(-(i - j) / length)). Writes
layer,head,tokens,mean_log_f,decay_length,median_f.

report: reads RESULTS/settings.env (written by dev/replicate.sh), sweep.csv, lr.csv,
timings.csv and each run's main.log, eval.loss.csv, eval.ppl.csv, eval.niah.csv and gates.csv
(RESULTS/runs/<model>/lr<lr>_s<seed>/), and writes the tables of RESULTS/results.md. Spreads are
mean +- sample standard deviation over the seeds (n in the header); a missing file leaves n/a.
"""
import csv
import math
import os
import struct
import sys

MAPS_MAGIC = 20261121


def die(msg, hint):
    sys.exit(f"error: {msg}\nHINT: {hint}")


# ---------------------------------------------------------------------------------------------
# gates


def gates(maps_path, out_path):
    if not os.path.exists(maps_path):
        die(f"{maps_path} is missing", "write it with train_fox -M maps -O <prefix> (all heads: no -D)")
    size = os.path.getsize(maps_path)
    with open(maps_path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != MAPS_MAGIC or header[1] != 1:
            die(f"{maps_path} is not a version-1 maps file", "pass the .maps.bin written by -M maps")
        T, n = header[2], header[3]
        per = 8 + 2 * 4 * T * T
        if size != 1024 + n * per or T < 2:
            die(f"{maps_path} is {size} bytes, expected {1024 + n * per} (T = {T})", "the file is truncated")
        rows = []
        for m in range(n):
            base = 1024 + m * per
            f.seek(base)
            layer, head = struct.unpack("<2i", f.read(8))
            logs = []
            for i in range(1, T):
                f.seek(base + 8 + 4 * (i * T + i - 1))
                fi = struct.unpack("<f", f.read(4))[0]
                logs.append(math.log(fi) if fi > 0 else -1e30)
            mean_log = sum(logs) / len(logs)
            length = -1.0 / mean_log if mean_log < 0 else math.inf
            med = math.exp(sorted(logs)[len(logs) // 2])
            rows.append((layer, head, len(logs), mean_log, length, med))
    with open(out_path + ".tmp", "w") as f:
        f.write("layer,head,tokens,mean_log_f,decay_length,median_f\n")
        for r in rows:
            f.write("%d,%d,%d,%.9g,%.9g,%.9g\n" % r)
    os.replace(out_path + ".tmp", out_path)
    print(f"wrote {out_path} ({len(rows)} heads, {T - 1} gates each)")


# ---------------------------------------------------------------------------------------------
# report


def read_settings(results):
    path = os.path.join(results, "settings.env")
    if not os.path.exists(path):
        die(f"{path} is missing", "run dev/replicate.sh first (it writes the settings)")
    s = {}
    for line in open(path):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            s[k] = v
    return s


def read_rows(path):
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def mean_sd(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None, None, 0
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd, len(xs)


def fmt(xs, digits=3):
    m, sd, n = mean_sd(xs)
    if m is None:
        return "n/a"
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if n > 1 else f"{m:.{digits}f}"


def log_fields(path, epoch_steps):
    """main.log: the last validation loss, the mean training loss of the last 10 steps and of the last
    10 steps of the first epoch (steps 1 .. epoch_steps: text the model has not seen yet), the median
    step's tok/s, and the validation curve [(tokens, loss)]"""
    if not os.path.exists(path):
        return None
    val, train, tokps, curve = None, [], [], []
    for line in open(path):
        f = dict(kv.split(":", 1) for kv in line.split() if ":" in kv)
        if "tel" in f:
            val = float(f["tel"])
            curve.append((int(f.get("tokens", 0)), val))
        if "trl" in f:
            train.append(float(f["trl"]))
            if "tokps" in f:
                tokps.append(float(f["tokps"]))
    tail = train[-10:]
    first = train[max(0, epoch_steps - 10):epoch_steps] if epoch_steps < len(train) else []
    return {
        "val": val,
        "train": sum(tail) / len(tail) if tail else None,
        "train_epoch1": sum(first) / len(first) if first else None,
        # the first steps include the start-up: the median step's speed
        "tokps": sorted(tokps)[len(tokps) // 2] if tokps else None,
        "curve": curve,
    }


def loss_curve(prefix):
    rows = read_rows(prefix + ".loss.csv")
    return [float(r["loss"]) for r in rows] if rows else None


def ppl_at(prefix, l):
    rows = read_rows(prefix + ".ppl.csv")
    for r in rows or []:
        if int(r["context"]) == l:
            return float(r["perplexity"])
    return None


def range_mean(L, lo, hi):
    """mean of L(i) for lo < i <= hi (1-based positions)"""
    if L is None or hi > len(L) or lo >= hi:
        return None
    seg = L[lo:hi]
    return sum(seg) / len(seg)


def report(results):
    s = read_settings(results)
    models = s["MODELS"].split()
    seeds = s["SEEDS"].split()
    T, eval_t = int(s["T"]), int(s["EVAL_T"])
    steps, total = int(s["STEPS"]), int(s["TOTAL"])
    train_tokens, val_tokens = int(s["TRAIN_TOKENS"]), int(s["VAL_TOKENS"])
    lr_rows = read_rows(os.path.join(results, "lr.csv")) or []
    lrs = {r["model"]: r["lr"] for r in lr_rows}
    sweep = read_rows(os.path.join(results, "sweep.csv"))

    def run(model, seed):
        return os.path.join(results, "runs", model, f"lr{lrs.get(model, '?')}_s{seed}")

    out = []
    w = out.append
    epochs = steps * total / train_tokens
    w(f"# dev/replicate.sh: {s.get('DEVICE', 'unknown')}, {s.get('DATE', '')}\n")
    w(f"Command: `{s.get('COMMAND', 'dev/replicate.sh')}`. Models `{s['SIZE']}`, trained at context {T} "
      f"for {steps} steps of {total:,} tokens ({steps * total:,} tokens, {epochs:.2f} epochs of the "
      f"{train_tokens:,} training tokens in `{s['DATA_DIR']}`), warmup 10%, cosine to 0; evaluated on "
      f"{val_tokens:,} held-out tokens ({(val_tokens - 1) // eval_t} sequences of {eval_t} = "
      f"{eval_t // T}x the training context). Seeds {', '.join(seeds)}; ± is the sample standard "
      f"deviation over them.\n")

    # the sweep
    if sweep:
        lr_set = []
        for r in sweep:
            if r["lr"] not in lr_set:
                lr_set.append(r["lr"])
        w("## Learning-rate sweep\n")
        w(f"Final validation loss at context {T}, seed {sweep[0]['seed']}, the same budget for every "
          "cell; the lowest picks the model's LR (bold).\n")
        w("| model | " + " | ".join(f"LR {x}" for x in lr_set) + " |")
        w("|---|" + "---|" * len(lr_set))
        for model in models:
            cells = []
            for x in lr_set:
                v = [r["val_loss"] for r in sweep if r["model"] == model and r["lr"] == x]
                v = v[0] if v and v[0] else "n/a"
                cells.append(f"**{v}**" if lrs.get(model) == x else v)
            w(f"| {model} | " + " | ".join(cells) + " |")
        w("")

    # the main table
    ranges = [(T // 2, T)]
    lo = T
    while lo < eval_t:
        ranges.append((lo, min(2 * lo, eval_t)))
        lo *= 2
    niah_cells = {}
    epoch_steps = train_tokens // total
    w(f"## The four models ({len(seeds)} seeds each)\n")
    w(f"Validation loss at context {T} (the whole held-out split); train loss: mean of the last 10 steps; "
      f"P(l) = exp(mean of L(1..l)) from the eval at {eval_t}; L far: mean L(i) over "
      f"{eval_t - eval_t // 8} < i <= {eval_t}; rise: L far minus mean L(i) over {T // 2} < i <= {T} "
      f"(the end of the training context); NIAH easy: cells (all contexts <= {T}, all depths, all seeds) "
      f"whose answer greedy decoding reproduces; log p: the mean log p(answer) (14 tokens, nats) in the "
      f"easy and the standard mode.\n")
    w(f"| model | LR | val loss | train loss | P({T}) | P({eval_t}) | L far | rise | NIAH easy | "
      f"log p easy / standard |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for model in models:
        logs = [log_fields(os.path.join(run(model, sd), "main.log"), epoch_steps) for sd in seeds]
        val = [x["val"] if x else None for x in logs]
        trn = [x["train"] if x else None for x in logs]
        Ls = [loss_curve(os.path.join(run(model, sd), "eval")) for sd in seeds]
        p_t = [ppl_at(os.path.join(run(model, sd), "eval"), T) for sd in seeds]
        p_l = [ppl_at(os.path.join(run(model, sd), "eval"), eval_t) for sd in seeds]
        far = [range_mean(L, eval_t - eval_t // 8, eval_t) for L in Ls]
        near = [range_mean(L, T // 2, T) for L in Ls]
        rise = [a - b if a is not None and b is not None else None for a, b in zip(far, near)]
        succ, cells, lp, lp_std = 0, 0, [], []
        per_cell = []
        for sd in seeds:
            rows = read_rows(os.path.join(run(model, sd), "eval.niah.csv"))
            for r in rows or []:
                if r["mode"] == "easy":
                    succ += int(r["greedy_success"])
                    cells += 1
                    lp.append(float(r["answer_logprob"]))
                else:
                    lp_std.append(float(r["answer_logprob"]))
                per_cell.append(r)
        niah_cells[model] = per_cell
        niah = f"{succ}/{cells}" if cells else "n/a"
        summary[model] = {"val": val, "rise": rise, "Ls": Ls, "logs": logs}
        lps = " / ".join(fmt([sum(x) / len(x)] if x else [], 1) for x in (lp, lp_std))
        w(f"| {model} | {lrs.get(model, 'n/a')} | {fmt(val)} | {fmt(trn)} | {fmt(p_t, 1)} | {fmt(p_l, 1)} | "
          f"{fmt(far)} | {fmt(rise)} | {niah} | {lps} |")
    w("")

    # L(i) by range of positions
    w("## Per-token loss by position\n")
    w("Mean L(i) over each range of positions i (the training context ends at "
      f"{T}; every range past it holds positions no model saw in training).\n")
    w("| model | " + " | ".join(f"{a + 1}-{b}" for a, b in ranges) + " |")
    w("|---|" + "---|" * len(ranges))
    for model in models:
        cells = [fmt([range_mean(L, a, b) for L in summary[model]["Ls"]]) for a, b in ranges]
        w(f"| {model} | " + " | ".join(cells) + " |")
    w("")

    # the Transformer's loss minus FoX's of the same block, by range: the text is the same, so what
    # the held-out passages at each position cost cancels
    pairs = [(a, b) for a, b in (("transformer-pro", "fox-pro"), ("transformer-llama", "fox-llama"))
             if a in models and b in models]
    if pairs:
        w(f"Transformer minus FoX of the same block, per range (the held-out text at each position is the same "
          f"for both, so its difficulty cancels; ± combines both spreads):\n")
        w("| block | " + " | ".join(f"{a + 1}-{b}" for a, b in ranges) + " |")
        w("|---|" + "---|" * len(ranges))
        for tr, fx in pairs:
            cells = []
            for a, b in ranges:
                mt, st, _ = mean_sd([range_mean(L, a, b) for L in summary[tr]["Ls"]])
                mf, sf, _ = mean_sd([range_mean(L, a, b) for L in summary[fx]["Ls"]])
                cells.append("n/a" if mt is None or mf is None else f"{mt - mf:+.3f} ± {math.hypot(st, sf):.3f}")
            w(f"| {tr.split('-')[1]} | " + " | ".join(cells) + " |")
        w("")

    # epochs: the validation loss near one epoch against the end; the training loss on text not yet
    # seen (the end of the first epoch) against the training loss on text seen before
    w("## Epochs\n")
    w(f"Validation loss after about one epoch ({train_tokens:,} tokens) and at the end "
      f"({steps * total:,}), same run (the cosine schedule is still decaying at one epoch); train loss "
      f"over steps {max(1, epoch_steps - 9)}-{epoch_steps} (the end of the first epoch: text the model has not "
      f"seen) and over the last 10 steps (text it has seen once):\n")
    w("| model | val loss near 1 epoch | at the end | train loss, end of epoch 1 | at the end | "
      "train tok/s (median step) |")
    w("|---|---|---|---|---|---|")
    for model in models:
        at1, end, trn1, trn, tps = [], [], [], [], []
        for x in summary[model]["logs"]:
            if not x or not x["curve"]:
                continue
            best = min(x["curve"], key=lambda c: abs(c[0] - train_tokens))
            at1.append(best[1])
            end.append(x["curve"][-1][1])
            trn1.append(x["train_epoch1"])
            trn.append(x["train"])
            tps.append(x["tokps"])
        w(f"| {model} | {fmt(at1)} | {fmt(end)} | {fmt(trn1)} | {fmt(trn)} | {fmt(tps, 0)} |")
    w("")

    # NIAH: log p(answer) across depth and length, easy mode
    w("## Needle in a haystack, easy mode: mean log p(answer) by depth and by context\n")
    for key, name in (("depth", "needle depth"), ("context", "context length")):
        vals = sorted({float(r[key]) for m in models for r in niah_cells[m] if r["mode"] == "easy"})
        if not vals:
            continue
        label = (lambda v: f"{100 * v:.0f}%") if key == "depth" else (lambda v: f"{v:.0f}")
        w(f"| model \\ {name} | " + " | ".join(label(v) for v in vals) + " |")
        w("|---|" + "---|" * len(vals))
        for model in models:
            cells = []
            for v in vals:
                xs = [float(r["answer_logprob"]) for r in niah_cells[model]
                      if r["mode"] == "easy" and float(r[key]) == v]
                cells.append(f"{sum(xs) / len(xs):.1f}" if xs else "n/a")
            w(f"| {model} | " + " | ".join(cells) + " |")
        w("")

    # gates
    gate_models = [m for m in models if any(os.path.exists(os.path.join(run(m, sd), "gates.csv")) for sd in seeds)]
    if gate_models:
        gates_t = int(s.get("GATES_T", T))
        edges = [0] + [e for e in (4, 16, 64) if e < T] + [T, math.inf]
        bins = [(a, b, f"< {b}" if a == 0 else (f"> {a}" if b == math.inf else f"{a}-{b}"))
                for a, b in zip(edges, edges[1:])]
        w("## Forget gates: heads by mean decay length\n")
        w(f"Decay length of a head: 1 / mean(-log f_i) over the first {gates_t} held-out tokens, from the "
          "sub-diagonal of -M maps' F (`dev/replicate_report.py gates`); heads counted over all seeds. "
          f"Short: the head forgets within a few tokens; > {T}: it keeps more than the training context.\n")
        w("| model | layer | " + " | ".join(b[2] for b in bins) + " | median length |")
        w("|---|---|" + "---|" * len(bins) + "---|")
        for model in gate_models:
            by_layer = {}
            for sd in seeds:
                for r in read_rows(os.path.join(run(model, sd), "gates.csv")) or []:
                    by_layer.setdefault(int(r["layer"]), []).append(float(r["decay_length"]))
            for layer in sorted(by_layer):
                xs = sorted(by_layer[layer])
                counts = [sum(1 for x in xs if a <= x < b) for a, b, _ in bins]
                w(f"| {model} | {layer} | " + " | ".join(str(c) for c in counts) + f" | {xs[len(xs) // 2]:.1f} |")
        w("")

    # timings
    trows = []
    tpath = os.path.join(results, "timings.csv")
    if os.path.exists(tpath):
        for line in open(tpath):
            p = line.strip().split(",")
            if len(p) == 5:
                trows.append((p[0], float(p[4])))
    if trows:
        per = {}
        for stage, sec in trows:
            per[stage] = per.get(stage, 0.0) + sec
        w("## Time\n")
        w(f"Seconds in the trainer per stage, summed over its runs ({s.get('DEVICE', '')}): " +
          ", ".join(f"{k} {v:.0f}" for k, v in per.items()) + f"; in all {sum(per.values()):.0f} s.\n")

    path = os.path.join(results, "results.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(out))
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "gates":
        gates(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__.strip().split("\n\n")[1] and "usage:\n" + __doc__.strip().split("\n\n")[1])


if __name__ == "__main__":
    main()
