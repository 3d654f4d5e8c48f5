"""
Kernel time table of train_fox training steps, from Nsight Compute.

    python dev/profile_step.py -- -e fox-pro-125m -b 16 -t 2048
    python dev/profile_step.py --steps 2 --binary ./train_fox -- -e fox-pro-760m -b 1 -t 16384 -r 1

Runs `ncu` over a short run of ./train_fox (validation and samples off), collects every kernel's
duration (gpu__time_duration.sum; clocks and caches left as they are), and prints a markdown
table: kernel, launches per step, time per step, share. ncu runs kernels one at a time, so the
table shows where the GPU's time goes, not launch gaps or overlap: the step time that train_fox
itself prints (without ncu) is the figure to compare against the table's total.

The run is `steps` steps; kernels launched before the first step (initialisation) are counted
separately by their launch order: everything before the first forward kernel of step 1 is
dropped, found as the first launch of the encoder kernel after the matmul tuning step (-X 1; its
last launch is a digest kernel). With gradient accumulation a step holds several micro-steps.

Matmul tuning is off (-X 0) unless the flags after -- set -X: under ncu every kernel runs
alone under the profiler, so the tuning step's timings measure ncu, not the candidates, and its
picks would be arbitrary. The table shows cuBLASLt's first choices; a tuned run (the default of
train_fox) is 2-3% faster at T = 2048 (dev/RESULTS.md).

--bandwidth adds each kernel's DRAM traffic (dram__bytes_read.sum + dram__bytes_write.sum) and
its rate against --peak-tbs (4.8 TB/s, the H200's HBM3e; 3.35 for an H100 SXM): how far a
memory-bound kernel is from its bound. Data served from L2 (50 MB) does not count as traffic.
"""
import argparse
import collections
import csv
import io
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ncu --csv prints each value in a unit it scales to fit (older versions spell them out): to nanoseconds,
# bytes and hertz; counts (cycle, inst) stay as they are
NCU_UNIT = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9,
            "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
            "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
            "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9, "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/second": 1}


NCU_COUNTS = ("", "cycle", "inst")


def ncu_value(row):
    """A csv.DictReader row of ncu --csv: its Metric Value in nanoseconds, bytes or hertz."""
    unit = row["Metric Unit"]
    if unit not in NCU_UNIT and unit not in NCU_COUNTS:
        sys.exit(f"error: ncu printed {row['Metric Name']} in '{unit}', a unit this script does not know\n"
                 "HINT: add it to NCU_UNIT in dev/profile_step.py")
    return float(row["Metric Value"].replace(",", "") or 0) * NCU_UNIT.get(unit, 1)


def short_name(name):
    # "void foo_kernel<128, (bool)1>(float*, ...)" -> "foo_kernel<128, 1>"
    name = re.sub(r"\(.*\)$", "", name.strip())
    name = re.sub(r"^void ", "", name)
    name = name.replace("(bool)", "").replace("(int)", "")
    return name if len(name) < 70 else name[:67] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="./train_fox")
    ap.add_argument("--steps", type=int, default=2, help="training steps profiled (the table is per step)")
    ap.add_argument("--first-kernel", default="encoder_forward",
                    help="substring of the first kernel of a training step (its first launch after the "
                         "matmul tuning step starts the table: drops initialisation and tuning)")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--bandwidth", action="store_true", help="add DRAM bytes and TB/s per kernel")
    ap.add_argument("--peak-tbs", type=float, default=4.8, help="DRAM bandwidth for the %% column (TB/s)")
    ap.add_argument("train_fox_args", nargs=argparse.REMAINDER, help="after --: flags for train_fox")
    args = ap.parse_args()
    extra = [a for a in args.train_fox_args if a != "--"]
    if "-X" not in extra:
        extra += ["-X", "0"]
    metrics = "gpu__time_duration.sum" + (",dram__bytes_read.sum,dram__bytes_write.sum" if args.bandwidth else "")
    cmd = [args.ncu, "--csv", "--metrics", metrics, "--clock-control", "none",
           "--cache-control", "none", args.binary, "-x", str(args.steps), "-v", "0", "-s", "0"] + extra
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        sys.exit("error: ncu or train_fox failed. HINT: build with 'make train_fox' and run on a GPU machine with ncu")
    lines = out.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("error: no kernel table in ncu's output. HINT: run the ncu command above by hand")
    step_lines = [l for l in lines[:start] if re.match(r"step\s+\d+/", l)]
    launches = {}  # launch ID -> [name, ms, bytes], in launch order
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        launch = launches.setdefault(row["ID"], [short_name(row["Kernel Name"]), 0.0, 0.0])
        if row.get("Metric Name") == "gpu__time_duration.sum":
            launch[1] = ncu_value(row) * 1e-6
        elif row.get("Metric Name", "").startswith("dram__bytes"):
            launch[2] += ncu_value(row)
    ordered = list(launches.values())
    # the first step's first kernel after the matmul tuning step (-X 1: its last launch is a digest)
    tuned = max((i for i, (n, _, _) in enumerate(ordered) if n.startswith("digest_kernel")), default=-1)
    first = next((i for i, (n, _, _) in enumerate(ordered) if i > tuned and args.first_kernel in n), 0)
    per_kernel = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for name, ms, nbytes in ordered[first:]:
        per_kernel[name][0] += 1
        per_kernel[name][1] += ms
        per_kernel[name][2] += nbytes
    total = sum(ms for _, ms, _ in per_kernel.values())
    print("\n".join(step_lines[-args.steps:]))
    print(f"\nkernels of {args.steps} step(s), per step: {total / args.steps:.2f} ms in "
          f"{sum(n for n, _, _ in per_kernel.values()) / args.steps:.0f} launches\n")
    if args.bandwidth:
        print(f"| kernel | launches/step | ms/step | share | GB/step | TB/s | of {args.peak_tbs:g} TB/s |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| kernel | launches/step | ms/step | share |")
        print("|---|---|---|---|")
    for name, (n, ms, nbytes) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
        row = f"| `{name}` | {n / args.steps:.0f} | {ms / args.steps:.2f} | {100 * ms / total:.1f}% |"
        if args.bandwidth:
            tbs = nbytes / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
            row += f" {nbytes / args.steps / 1e9:.2f} | {tbs:.2f} | {100 * tbs / args.peak_tbs:.0f}% |"
        print(row)


if __name__ == "__main__":
    main()
