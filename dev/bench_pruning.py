"""
Adaptive computation pruning on trained gates (dev/fox.md, "Adaptive computation pruning"), one
command on a GPU machine:

    make train_fox train_fox_cpu && python3 dev/bench_pruning.py

1. Trains a FoX (Pro) checkpoint with train_fox at T = 16384 (skipped when --dir already holds one):
   the gates pruning relies on are the trained ones, not those at initialisation.
2. For each T in --lengths, with pruning off (-A 0) and on (-A 1), from that checkpoint:
   - attention time per training step: Nsight Compute's durations of every attention kernel of one
     step (forward, backward, the pruning tables' pass), summed;
   - end-to-end step time and tokens/s: train_fox's own step lines (steps after the warm-up), and
     the share of 128 x 128 attention tiles skipped that train_fox prints with -A 1;
   - validation loss at context T (`-M eval`, every sequence of -j that fits): -A 1 must equal -A 0
     within 1e-3.
3. Generation with the CPU twin's KV cache from the same checkpoint: a long prompt (the first
   tokens of the validation shard) and greedy tokens with eviction off and on: the generated tokens
   must be identical; prompt time, time per generated token and the cache's memory are printed.

Prints markdown tables and writes them to <dir>/results.md. Tokens per training step are the same
at every T (--tokens), so the rows compare like with like.
"""
import argparse
import csv
import glob
import io
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, log=None):
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if log is not None:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n" + out.stdout + out.stderr + "\n")
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        sys.exit(f"error: the command above failed (exit {out.returncode}). HINT: its output is above and in {log}")
    print(f"  ({time.time() - t0:.0f} s)", flush=True)
    return out.stdout


def checkpoint(args, log):
    found = sorted(glob.glob(os.path.join(args.dir, "ckpt", "model_*.bin")))
    if found:
        print(f"checkpoint: {found[-1]} (delete {args.dir}/ckpt to retrain)")
        return found[-1]
    cmd = [args.binary, "-e", args.preset, "-b", str(args.train_batch), "-t", str(args.train_T), "-x", str(args.train_steps),
           "-l", str(args.lr), "-v", str(args.train_steps), "-m", "0", "-s", "0", "-o", os.path.join(args.dir, "ckpt")]
    out = run(cmd, log=log)
    vals = re.findall(r"val loss ([0-9.]+)", out)
    print(f"trained: {args.train_steps} steps of {args.train_batch} x {args.train_T} tokens, val loss {vals[0]} -> {vals[-1]}")
    return sorted(glob.glob(os.path.join(args.dir, "ckpt", "model_*.bin")))[-1]


def step_times(out, skip):
    ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms \|", out)]
    if len(ms) <= skip:
        sys.exit("error: train_fox printed too few step lines. HINT: raise --steps")
    pruned = [float(p) for p in re.findall(r"pruned ([0-9.]+)% of tiles", out)]
    rest = ms[skip:]
    return sum(rest) / len(rest), (sum(pruned[skip:]) / len(pruned[skip:]) if pruned else 0.0)


def attention_ms(args, model, B, T, prune, log):
    cmd = [args.ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--cache-control", "none",
           "-k", "regex:fox_|attention", args.binary, "-e", model, "-b", str(B), "-t", str(T), "-x", "1", "-v", "0",
           "-s", "0", "-l", str(args.step_lr), "-A", str(prune)]
    out = run(cmd, log=log)
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("error: no kernel table in ncu's output. HINT: run the ncu command above by hand")
    total, parts = 0.0, {"forward": 0.0, "backward": 0.0, "tables": 0.0}
    scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        t = float(row["Metric Value"].replace(",", "")) * scale[row["Metric Unit"]]
        name = row["Kernel Name"]
        total += t
        if "prune" in name:
            parts["tables"] += t
        elif "bwd" in name or "backward" in name or "delta" in name or "scan" in name:
            parts["backward"] += t
        else:
            parts["forward"] += t
    return total, parts


def val_loss(args, model, T, prune, log):
    out = run([args.binary, "-M", "eval", "-e", model, "-t", str(T), "-b", "1", "-m", "0", "-A", str(prune)], log=log)
    rows = re.findall(r"^\s*" + str(T) + r"\s+([0-9.]+)\s+([0-9.]+)\s*$", out, re.M)
    seqs = re.search(r"(\d+) sequences of", out)
    if not rows:
        sys.exit(f"error: no mean loss at context {T} in the eval output. HINT: see {log}")
    share = re.search(r"([0-9.]+)% of \d+ attention tiles", out)
    return float(rows[-1][1]), int(seqs.group(1)) if seqs else 0, float(share.group(1)) if share else 0.0


def generate(args, model, prune, log):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    val = os.path.relpath(sorted(glob.glob(os.path.join(ROOT, "data/gutenberg/gutenberg_val_*.bin")))[0], ROOT)
    out = run([args.cpu_binary, "-M", "generate", "-e", model, "-P", "@" + val, "-t", str(args.prompt + args.gen),
               "-g", str(args.gen), "-T", "0", "-A", str(prune)], env=env, log=log)
    # prompt and generated tokens sit between the first and the last separator (the text may hold "---" lines)
    text = out[out.index("\n---\n") + 5:out.rindex("\n---\n")] if out.count("\n---\n") >= 2 else ""
    t = re.search(r"the prompt \((\d+) tokens\) ([0-9.]+) s, then ([0-9.]+) ms per generated token", out)
    c = re.search(r"live \(([0-9.]+)%\), ([0-9.]+) of ([0-9.]+) MiB.*buffers ([0-9.]+) MiB now, ([0-9.]+) MiB at most", out)
    if t is None or c is None:
        sys.exit(f"error: unexpected generate output. HINT: see {log}")
    return text, int(t.group(1)), float(t.group(2)), float(t.group(3)), [float(x) for x in c.groups()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="bench_pruning", help="checkpoint and logs (default bench_pruning/)")
    ap.add_argument("--binary", default="./train_fox")
    ap.add_argument("--cpu-binary", default="./train_fox_cpu")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--preset", default="fox-pro-125m")
    ap.add_argument("--train-T", type=int, default=16384)
    ap.add_argument("--train-batch", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=2e-3, help="peak LR of the checkpoint's training (dev/fox.md, 125M Pro)")
    ap.add_argument("--lengths", default="16384,32768,65536")
    ap.add_argument("--tokens", type=int, default=65536, help="tokens per timed training step at every T")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per run (the first 3 are warm-up)")
    ap.add_argument("--step-lr", type=float, default=1e-5, help="LR of the timed steps (keeps the gates as trained)")
    ap.add_argument("--prompt", type=int, default=8192, help="prompt tokens for generation (0: skip generation)")
    ap.add_argument("--gen", type=int, default=128, help="generated tokens")
    ap.add_argument("--threads", type=int, default=16, help="OpenMP threads of the CPU twin")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    log = os.path.join(args.dir, "log.txt")
    open(log, "w").close()
    model = checkpoint(args, log)
    lines = [f"checkpoint: {model}", "",
             "| T | B | pruning | tiles skipped | attention ms/step (fwd, bwd, tables) | speed-up | step ms | tok/s | speed-up | val loss (seqs) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for T in [int(x) for x in args.lengths.split(",") if x]:
        B = max(1, args.tokens // T)
        res = {}
        for prune in (0, 1):
            att, parts = attention_ms(args, model, B, T, prune, log)
            out = run([args.binary, "-e", model, "-b", str(B), "-t", str(T), "-x", str(args.steps), "-v", "0", "-s", "0",
                       "-l", str(args.step_lr), "-A", str(prune)], log=log)
            ms, share = step_times(out, 3)
            vl, seqs, eval_share = val_loss(args, model, T, prune, log)
            res[prune] = (att, parts, ms, share, vl, seqs, eval_share)
        for prune in (0, 1):
            att, parts, ms, share, vl, seqs, eval_share = res[prune]
            sp_att = res[0][0] / att
            sp_step = res[0][2] / ms
            skipped = f"{share:.1f}% (eval {eval_share:.1f}%)" if prune else "-"
            lines.append(f"| {T} | {B} | {'-A 1' if prune else 'off'} | {skipped} | {att:.1f} ({parts['forward']:.1f}, "
                         f"{parts['backward']:.1f}, {parts['tables']:.2f}) | {sp_att:.2f}x | {ms:.1f} | {B * T / ms * 1e3:.0f} | "
                         f"{sp_step:.2f}x | {vl:.6f} ({seqs}) |")
        dl = abs(res[1][4] - res[0][4])
        lines.append(f"| | | | | | | | | | val loss difference {dl:.2e} ({'PASS' if dl <= 1e-3 else 'FAIL'} <= 1e-3) |")
        print("\n".join(lines[-3:]), flush=True)
    if args.prompt > 0:
        lines += ["", f"Generation on the CPU twin ({args.threads} threads): prompt = the first {args.prompt} tokens of the "
                  f"validation shard, then {args.gen} greedy tokens.", "",
                  "| eviction | prompt s | ms / generated token | live (position, head) entries | live MiB of full | cache buffers MiB (now, peak) |",
                  "|---|---|---|---|---|---|"]
        gens = {}
        for prune in (0, 1):
            text, n, tp, tt, c = generate(args, model, prune, log)
            gens[prune] = text
            lines.append(f"| {'-A 1' if prune else 'off'} | {tp:.1f} | {tt:.2f} | {c[0]:.1f}% | {c[1]:.2f} of {c[2]:.2f} | "
                         f"{c[3]:.2f}, {c[4]:.2f} |")
        same = gens[0] == gens[1] and gens[0] != ""
        lines.append(f"\ngenerated tokens with eviction identical to without: {'PASS' if same else 'FAIL'}")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    with open(os.path.join(args.dir, "results.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
