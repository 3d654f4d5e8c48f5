"""
What each attention kernel does for its time: the fused FoX kernels (dev/cuda's API), with the
gate and without, against PyTorch SDPA on cuDNN (no gate), on the same tensors, one shape at a time.

    python dev/attention_work.py --lib dev/cuda/libfox_attention.so --shape 1 12 16384 64
    ncu --profile-from-start off --clock-control none --csv --metrics $(python dev/attention_work.py --metrics) \\
        python dev/attention_work.py --lib dev/cuda/libfox_attention.so --shape 1 12 16384 64 --runs 1 --profile \\
        > work.csv
    python dev/attention_work.py --summarize work.csv

1. runs forward+backward --runs times and says for each whether the backward's gradients are the
   same bits every run (a backward that adds partial sums with atomics, in whatever order they
   arrive, is not);
2. with --profile, brackets one forward+backward of each (ours with the gate, ours without, cuDNN)
   between cudaProfilerStart and Stop (all other work, warm-up included, outside), so
   `ncu --profile-from-start off` measures those kernels only, in that order (fox_* are ours);
3. --summarize adds up ncu's numbers per forward and per backward: time, tensor-pipe cycles (the
   matmul work), MUFU instructions (the exponentials), all instructions, DRAM bytes.
"""
import argparse
import collections
import csv
import os
import sys


METRICS = ("gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second,sm__inst_executed.sum,"
           "sm__pipe_tensor_cycles_active.sum,sm__inst_executed_pipe_xu.sum,dram__bytes_read.sum,dram__bytes_write.sum")


def summarize(path):
    """ncu --csv output of one --profile run -> a line per (kernel set, forward or backward)."""
    from profile_step import ncu_value  # the values in nanoseconds, bytes and hertz
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    if not rows:
        sys.exit(f"{path}: no ncu CSV rows\nHINT: run ncu with --csv and --metrics $(python {sys.argv[0]} --metrics)")
    kernels = collections.OrderedDict()
    for r in rows:
        kernels.setdefault((int(r["ID"]), r["Kernel Name"]), {})[r["Metric Name"]] = ncu_value(r)
    sets, names = [], ["fox (gate)", "fox (no gate)", "sdpa cudnn (no gate)"]
    for (_, name), m in kernels.items():  # a forward kernel starts the next set
        fwd = "fox_fwd" in name or "fprop" in name
        if fwd:
            sets.append({"fwd": [], "bwd": []})
        if sets:
            sets[-1]["fwd" if fwd else "bwd"].append(m)
    print(f"{'set':22s} {'pass':4s} {'us':>8s} {'tensor cyc':>11s} {'MUFU inst':>10s} {'inst':>9s} {'DRAM MB':>8s} {'MHz':>5s}")
    for name, st in zip(names, sets):
        for part in ("fwd", "bwd"):
            ms = st[part]
            us = sum(m["gpu__time_duration.sum"] for m in ms) / 1e3
            mhz = sum(m["sm__cycles_elapsed.avg.per_second"] * m["gpu__time_duration.sum"] for m in ms) / (us * 1e9)
            total = {k: sum(m[k] for m in ms) for k in ("sm__pipe_tensor_cycles_active.sum",
                                                        "sm__inst_executed_pipe_xu.sum", "sm__inst_executed.sum")}
            dram = sum(m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"] for m in ms) / 1e6
            print(f"{name:22s} {part:4s} {us:8.1f} {total['sm__pipe_tensor_cycles_active.sum'] / 1e6:10.1f}M "
                  f"{total['sm__inst_executed_pipe_xu.sum'] / 1e6:9.1f}M {total['sm__inst_executed.sum'] / 1e6:8.1f}M "
                  f"{dram:8.1f} {mhz:5.0f}")


def bits(ts):
    import torch
    return [t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).clone() for t in ts]


def same(a, b):
    return all(x.equal(y) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="a built libfox_attention.so")
    ap.add_argument("--shape", nargs=4, type=int, default=[1, 12, 16384, 64], metavar=("B", "H", "T", "HD"))
    ap.add_argument("--runs", type=int, default=5, help="forward+backward runs compared bit for bit")
    ap.add_argument("--profile", action="store_true", help="one run of each between cudaProfilerStart/Stop")
    ap.add_argument("--metrics", action="store_true", help="print the ncu metrics --summarize needs")
    ap.add_argument("--summarize", metavar="CSV", help="sum up an ncu --csv run of --profile")
    args = ap.parse_args()
    if args.metrics:
        print(METRICS)
        return
    if args.summarize:
        summarize(args.summarize)
        return
    if not args.lib:
        sys.exit("--lib is needed to run the kernels\nHINT: make -C dev/cuda builds dev/cuda/libfox_attention.so")
    import torch  # here, so that --metrics and --summarize run without torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_attention as ba  # the ctypes API and the benchmark's inputs
    if args.runs < 1:
        sys.exit("--runs must be at least 1\nHINT: --runs 1 with --profile, 5 to check determinism")
    ba.LIB = args.lib
    fox = ba.Fox()
    B, H, T, hd = args.shape
    q, k, v, dout, c = ba.make_inputs(B, T, H, hd, 0.05)  # the benchmark's tensors
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, device="cuda")
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    dlogf = torch.empty(B, H, T, device="cuda")
    scratch = torch.empty(3 * B * H * T, device="cuda")

    def fox_step(cc=c):
        fox.forward(o, lse, q, k, v, cc)
        fox.backward(dq, dk, dv, dlogf if cc is not None else None, scratch, dout, q, k, v, o, lse, cc)
        return (dq, dk, dv, dlogf) if cc is not None else (dq, dk, dv)

    qt, kt, vt, dt = (x.transpose(1, 2) for x in (q, k, v, dout))
    ql, kl, vl = (x.detach().requires_grad_() for x in (qt, kt, vt))

    def cudnn_step():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
            return torch.autograd.grad(out, (ql, kl, vl), dt)

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; {B} x {H} x {T} x {hd}, causal, bf16")
    steps = (("fox (gate)", fox_step), ("fox (no gate)", lambda: fox_step(None)), ("sdpa cudnn (no gate)", cudnn_step))
    for name, step in steps:
        first = bits(step())  # also the warm-up
        torch.cuda.synchronize()
        diff = 0
        for _ in range(args.runs - 1):
            diff += not same(first, bits(step()))
        torch.cuda.synchronize()
        verdict = "n/a (one run)" if args.runs == 1 else (
            "same bits in every run" if diff == 0 else f"bits differ from the first in {diff} of {args.runs - 1} runs")
        print(f"  {name:22s} backward: {verdict}")
    if args.profile:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _, step in steps:
            step()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("  profiled: one forward+backward of each, in the order above")


if __name__ == "__main__":
    main()
