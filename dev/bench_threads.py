#!/usr/bin/env python3
"""
./test_fox's wall and CPU time at several thread counts (OMP_NUM_THREADS): the twin must not get slower with more
threads than cores. The runs alternate between the counts, so that a shared machine's load falls on each alike;
prints every run, then per count the median and the least wall time, the median CPU time (user + system: what
spinning threads burn) and the median of each test group's time.

    make test_fox && python3 dev/bench_threads.py 16 64          # on a 16-core machine
    python3 dev/bench_threads.py --reps 5 2 32                   # on a 2-core one
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def run_once(binary, threads, extra_env):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **extra_env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([binary], env=env, capture_output=True, text=True).stdout
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    groups, title = {}, None
    for line in out.splitlines():
        if line.startswith("# "):
            title = line[2:]
        m = re.match(r"  \(([0-9.]+) s\)$", line)
        if m and title is not None:
            groups[title] = float(m.group(1))
    summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    return wall, cpu, groups, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("threads", nargs="*", type=int, default=[2, 32], help="thread counts (default: 2 32)")
    ap.add_argument("--reps", type=int, default=3, help="runs per thread count (default 3)")
    ap.add_argument("--bin", default="./test_fox", help="the test binary (default ./test_fox)")
    ap.add_argument("--passive", action="store_true", help="also set OMP_WAIT_POLICY=passive")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"error: {a.bin} is not an executable\nHINT: make test_fox first, or pass --bin")
    extra = {"OMP_WAIT_POLICY": "passive"} if a.passive else {}
    runs = {t: [] for t in a.threads}
    for rep in range(a.reps):
        for t in a.threads:
            wall, cpu, groups, summary = run_once(a.bin, t, extra)
            runs[t].append((wall, cpu, groups))
            print(f"run {rep + 1}, {t:3d} threads: {wall:7.1f} s wall, {cpu:7.1f} s CPU | {summary}", flush=True)
    print(f"\n{os.cpu_count()} processors; median (least) wall, median CPU, seconds:")
    for t in a.threads:
        walls = [r[0] for r in runs[t]]
        print(f"{t:3d} threads: {statistics.median(walls):7.1f} ({min(walls):.1f}) wall, "
              f"{statistics.median(r[1] for r in runs[t]):7.1f} CPU")
    titles = list(runs[a.threads[0]][0][2])
    print("\nmedian per group, seconds: " + " | ".join(f"{t} threads" for t in a.threads))
    for title in titles:
        meds = [statistics.median(r[2].get(title, float("nan")) for r in runs[t]) for t in a.threads]
        print(f"  {title[:60]:60s} " + " | ".join(f"{m:6.1f}" for m in meds))


if __name__ == "__main__":
    main()
