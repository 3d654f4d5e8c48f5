"""
Where the GPU's time goes in real training steps, launch gaps included: every kernel, copy and
memset of a short train_fox run, timed by CUPTI as the run executes them (no replay, no
serialisation, clocks as in training), summed per step.

    python3 dev/trace_step.py -- -e fox-pro-125m -b 16 -t 2048
    python3 dev/trace_step.py --steps 4 --warmup 4 -- -e fox-pro-760m -b 1 -t 16384

Builds build/libkernel_trace.so from dev/kernel_trace.c (gcc and the CUDA toolkit's CUPTI) and
runs ./train_fox under it (CUDA_INJECTION64_PATH). A step ends with the AdamW kernel; the tables
cover the last --steps of --warmup + --steps steps: the span from one AdamW's end to the next, the
time some kernel, copy or memset ran (busy), the time the GPU waited for the host (idle: launch
gaps and synchronisations), the kernels grouped (attention, cuBLASLt, the rest) and one by one,
and the largest gaps by the pair of launches around them. dev/profile_step.py (Nsight Compute)
measures each kernel alone; this one measures the step as it runs. Needs no nsys.
"""
import argparse
import collections
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step import short_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "build", "libkernel_trace.so")


def cuda_root():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def cupti_dirs():
    root = cuda_root()
    inc = [d for d in (f"{root}/include", f"{root}/extras/CUPTI/include", f"{root}/targets/x86_64-linux/include")
           if os.path.exists(f"{d}/cupti.h")]
    lib = [d for d in (f"{root}/lib64", f"{root}/lib", f"{root}/targets/x86_64-linux/lib", f"{root}/extras/CUPTI/lib64")
           if glob.glob(f"{d}/libcupti.so*")]
    if not inc or not lib:
        sys.exit(f"error: no CUPTI (cupti.h, libcupti.so) under {root}\n"
                 "HINT: install the CUDA toolkit's CUPTI, or put nvcc of a full toolkit on PATH")
    return inc[0], lib[0]


def build_library():
    src = os.path.join(ROOT, "dev", "kernel_trace.c")
    inc, lib = cupti_dirs()
    if os.path.exists(LIB) and os.path.getmtime(LIB) >= os.path.getmtime(src):
        return lib
    os.makedirs(os.path.dirname(LIB), exist_ok=True)
    cmd = ["gcc", "-O2", "-shared", "-fPIC", f"-I{inc}", src, "-o", LIB, f"-L{lib}", "-lcupti", "-lstdc++",
           f"-Wl,-rpath,{lib}"]
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        sys.exit("error: building the CUPTI library failed. HINT: needs gcc and the CUDA toolkit's CUPTI headers")
    return lib


def category(name):
    if name.startswith("fox_"):
        return "attention (fox_*)"
    if any(s in name for s in ("nvjet", "cublas", "cutlass", "gemm", "splitKreduce")):
        return "matmuls (cuBLASLt)"
    if name.startswith(("copy ", "memset ")):
        return "copies and memsets"
    return "the rest"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="./train_fox")
    ap.add_argument("--steps", type=int, default=5, help="steps in the tables (per-step numbers)")
    ap.add_argument("--warmup", type=int, default=5, help="steps run before them")
    ap.add_argument("--top", type=int, default=25, help="rows of the kernel and gap tables")
    ap.add_argument("train_fox_args", nargs=argparse.REMAINDER, help="after --: flags for train_fox")
    args = ap.parse_args()
    extra = [a for a in args.train_fox_args if a != "--"]
    libdir = build_library()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.csv")
        env = dict(os.environ, CUDA_INJECTION64_PATH=LIB, KERNEL_TRACE_OUT=trace,
                   LD_LIBRARY_PATH=libdir + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
        cmd = [args.binary, "-x", str(args.steps + args.warmup), "-v", "0", "-s", "0"] + extra
        print("$ " + " ".join(cmd), flush=True)
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if out.returncode != 0 or not os.path.exists(trace):
            sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
            sys.exit("error: train_fox failed under the trace. HINT: build it with 'make train_fox', run on a GPU")
        recs = sorted((int(r[0]), int(r[1]), r[3]) for r in csv.reader(open(trace)))
    step_lines = [l for l in out.stdout.splitlines() if l.startswith("step ") and "| loss " in l]
    ends = [i for i, r in enumerate(recs) if r[2].startswith("adamw_kernel")]
    if len(ends) < args.steps + 1:
        sys.exit(f"error: {len(ends)} AdamW launches in the trace, need {args.steps + 1}. HINT: raise --warmup")
    first, last = ends[-args.steps - 1], ends[-1]
    seg = recs[first + 1:last + 1]
    n = args.steps
    span = seg[-1][1] - recs[first][1]
    per_kernel = collections.defaultdict(lambda: [0, 0])
    per_cat = collections.defaultdict(lambda: [0, 0])
    gaps = collections.defaultdict(lambda: [0, 0])
    hist = collections.Counter()
    prev_end, prev_name, idle = recs[first][1], short_name(recs[first][2]), 0
    for start, end, name in seg:
        name = short_name(name)
        per_kernel[name][0] += 1
        per_kernel[name][1] += end - start
        per_cat[category(name)][0] += 1
        per_cat[category(name)][1] += end - start
        if start > prev_end:
            idle += start - prev_end
            key = f"`{prev_name[:40]}` -> `{name[:40]}`"
            gaps[key][0] += 1
            gaps[key][1] += start - prev_end
            hist[min((start - prev_end) // 1000, 10)] += 1
        if end > prev_end:
            prev_end, prev_name = end, name
    busy = span - idle
    print("\n".join(step_lines[-n:]))
    print(f"\n{n} steps, per step: span {span / n / 1e6:.2f} ms = busy {busy / n / 1e6:.2f} + idle "
          f"{idle / n / 1e6:.2f} ms ({100 * idle / span:.1f}%), {len(seg) / n:.0f} launches")
    print("gaps per step by length (us): " + ", ".join(
        f"{'>=' if h == 10 else ''}{h}-{h + 1}: {c / n:.0f}" for h, c in sorted(hist.items())))
    print("\n| group | launches/step | ms/step | share of busy |\n|---|---|---|---|")
    for cat, (c, ns) in sorted(per_cat.items(), key=lambda kv: -kv[1][1]):
        print(f"| {cat} | {c / n:.0f} | {ns / n / 1e6:.2f} | {100 * ns / busy:.1f}% |")
    print("\n| kernel | launches/step | ms/step | share of busy |\n|---|---|---|---|")
    for name, (c, ns) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"| `{name}` | {c / n:.0f} | {ns / n / 1e6:.3f} | {100 * ns / busy:.1f}% |")
    print("\n| gap after -> before | count/step | us/step |\n|---|---|---|")
    for key, (c, ns) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"| {key} | {c / n:.0f} | {ns / n / 1e3:.1f} |")


if __name__ == "__main__":
    main()
