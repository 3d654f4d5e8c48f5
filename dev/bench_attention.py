"""
One-command comparison of the fused FoX attention kernels (dev/cuda) with PyTorch's peers.

    python dev/bench_attention.py            # build, check, time (needs an sm_90 GPU, nvcc, torch)
    python dev/bench_attention.py --lib dev/cuda/libfox_attention.so   # use a library built by dev/cuda's make
    python dev/bench_attention.py --lib a.so --compare b.so   # two trees' kernels, in turn, ratio b / a

1. builds dev/cuda/fox_attention_lib.cu into build/libfox_attention.so with nvcc, with the flags of
   dev/cuda/Makefile (train_fox.cu's own: the library includes train_fox.cu, so it times exactly the
   attention that trains: fox_attention_forward, fox_attention_backward);
2. calls it through ctypes on torch tensors' data pointers and checks o, lse, dq, dk, dv and
   d(log f) against an fp64 PyTorch reference (materialised T x T, small shapes);
3. times forward and forward+backward on the benchmark shapes (SHAPES below) against PyTorch SDPA with
   no gate (each backend it can select) and FlexAttention with a FoX score_mod, on the same
   tensors, and prints TFLOP/s (FlashAttention convention: causal forward 2*B*H*T^2*hd,
   forward+backward 3.5x that) and the ratios.
"""
import argparse
import ctypes
import math
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "build", "libfox_attention.so")
SHAPES = [(8, 12, 2048, 64), (2, 12, 8192, 64), (1, 12, 16384, 64), (1, 16, 16384, 128), (4, 16, 4096, 128)]


def build():
    """The library as dev/cuda/Makefile builds it: train_fox.cu's flags (one GPU: no NCCL, no GPT-2
    encoder), -fPIC -shared."""
    os.makedirs(os.path.dirname(LIB), exist_ok=True)
    cmd = ["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--default-stream", "per-thread",
           "-DNO_NCCL", "-DNO_GPT2_ENCODER", "-Xcompiler", "-fopenmp,-Wno-unused-function", "-Xcompiler", "-fPIC",
           "-shared", os.path.join(ROOT, "dev", "cuda", "fox_attention_lib.cu"), "-o", LIB,
           "-lcublasLt", "-lcublas", "-lm"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


class Fox:
    """The C API on torch tensors: q, k, v, o (B, T, H, hd) bf16 with a token stride; c (B, H, T) fp32."""

    def __init__(self, path=None):
        self.lib = ctypes.CDLL(path or LIB)
        P, I = ctypes.c_void_p, ctypes.c_int
        self.lib.fox_fwd.argtypes = [P] * 6 + [I] * 7 + [P]
        self.lib.fox_bwd.argtypes = [P] * 12 + [I] * 7 + [P]

    @staticmethod
    def _p(x):
        return None if x is None else x.data_ptr()

    @staticmethod
    def _stride(x):
        assert x.dtype == torch.bfloat16 and x.stride(3) == 1 and x.stride(2) == x.shape[3], "need (B, T, H, hd) rows"
        assert x.stride(0) == x.shape[1] * x.stride(1), "batch stride must be T * token stride"
        return x.stride(1)

    def forward(self, o, lse, q, k, v, c, window=0):
        B, T, H, hd = q.shape
        s = torch.cuda.current_stream().cuda_stream
        self.lib.fox_fwd(self._p(o), self._p(lse), self._p(q), self._p(k), self._p(v), self._p(c),
                         B, T, H, hd, self._stride(q), self._stride(o), window, s)

    def backward(self, dq, dk, dv, dlogf, scratch, dout, q, k, v, o, lse, c, window=0):
        """scratch: fp32, 3 * B * H * T elements."""
        B, T, H, hd = q.shape
        assert all(x.stride() == q.stride() for x in (k, v, dq, dk, dv)), "dq, dk, dv share q's strides"
        assert dout.stride() == o.stride() and scratch.numel() >= 3 * B * H * T
        s = torch.cuda.current_stream().cuda_stream
        self.lib.fox_bwd(self._p(dq), self._p(dk), self._p(dv), self._p(dlogf), self._p(scratch), self._p(dout),
                         self._p(q), self._p(k), self._p(v), self._p(o), self._p(lse), self._p(c),
                         B, T, H, hd, self._stride(q), self._stride(o), window, s)


def make_inputs(B, T, H, hd, gate_rate, packed=False, seed=0):
    """q, k, v (B, T, H, hd) bf16 (views of one packed qkv buffer when packed), dout, c (B, H, T) fp32."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if packed:
        qkv = torch.randn(B, T, 3, H, hd, device="cuda", generator=g).bfloat16()
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q, k, v = (torch.randn(B, T, H, hd, device="cuda", generator=g).bfloat16() for _ in range(3))
    dout = torch.randn(B, T, H, hd, device="cuda", generator=g).bfloat16()
    c = None
    if gate_rate:
        logf = -gate_rate * (0.5 + torch.rand(B, H, T, device="cuda", generator=g))
        c = torch.cumsum(logf, -1).float().contiguous()  # fp32, as the trainer computes it
    return q, k, v, dout, c


def run_fox(fox, q, k, v, dout, c, window):
    B, T, H, hd = q.shape
    o = torch.full((B, T, H, hd), float("nan"), device="cuda", dtype=torch.bfloat16)  # poison
    lse = torch.full((B, H, T), float("nan"), device="cuda")
    # same strides as q, k, v (full_like would make a packed view's copy contiguous)
    dq, dk, dv = (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda").fill_(float("nan"))
                  for x in (q, k, v))
    dlogf = torch.full((B, H, T), float("nan"), device="cuda") if c is not None else None
    scratch = torch.empty(3 * B * H * T, device="cuda")
    fox.forward(o, lse, q, k, v, c, window)
    fox.backward(dq, dk, dv, dlogf, scratch, dout, q, k, v, o, lse, c, window)
    torch.cuda.synchronize()
    return o, lse, dq, dk, dv, dlogf


def reference(q, k, v, dout, c, window):
    """fp64, materialised scores; the mask is applied before exp (masked_fill), never multiplied."""
    B, T, H, hd = q.shape
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    cd = c.double().requires_grad_() if c is not None else None
    s = qd.transpose(1, 2) @ kd.transpose(1, 2).transpose(-1, -2) / math.sqrt(hd)  # (B, H, T, T)
    if cd is not None:
        s = s + cd[..., :, None] - cd[..., None, :]
    i = torch.arange(T, device="cuda")[:, None]
    j = torch.arange(T, device="cuda")[None, :]
    mask = j <= i
    if window:
        mask &= j > i - window
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = (torch.softmax(s, -1) @ vd.transpose(1, 2)).transpose(1, 2)  # (B, T, H, hd)
    o.backward(dout.double())
    dlogf = cd.grad.flip(-1).cumsum(-1).flip(-1) if cd is not None else None
    return o.detach(), lse.detach(), qd.grad, kd.grad, vd.grad, dlogf


def rel(x, ref):
    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def check(fox):
    # bf16 tensors against fp64: output rounding alone is ~2e-3 relative, P and dS are rounded to
    # bf16 before the second matmuls; 1e-2 fails any indexing or masking error (those are O(1)).
    # lse is fp32 from exact bf16 products: absolute 1e-3. With log f ~ -5 rows of P are nearly
    # one-hot and dS_ii = P_ii (dP_ii - Delta_i) cancels, so the bf16 O inside Delta shows on dq,
    # dk (~1.4e-2, as in any FlashAttention-style backward): 2e-2 there.
    cases = [  # B, T, H, hd, gate rate, window, packed, tolerance of dq and dk
        (2, 1000, 3, 64, 0.1, 0, True, 1e-2),
        (1, 777, 2, 128, 1.0, 300, False, 1e-2),
        (2, 513, 2, 64, 0.0, 0, False, 1e-2),
        (1, 2048, 2, 64, 5.0, 0, False, 2e-2),
        (1, 2048, 2, 128, 1e-4, 0, True, 1e-2),
        (2, 2048, 12, 64, 0.05, 0, False, 1e-2),  # the first benchmark shape, two sequences
    ]
    ok = True
    print("\ncheck against an fp64 PyTorch reference (relative L2 errors; lse: max abs)")
    print(f"{'B x T x H x hd, gate, window':34s} {'o':>9s} {'lse':>9s} {'dq':>9s} {'dk':>9s} {'dv':>9s} {'dlogf':>9s}")
    for B, T, H, hd, rate, window, packed, tol_dqdk in cases:
        q, k, v, dout, c = make_inputs(B, T, H, hd, rate, packed, seed=B * T + hd)
        got = run_fox(fox, q, k, v, dout, c, window)
        ref = reference(q, k, v, dout, c, window)
        errs = [rel(got[0], ref[0]), (got[1].double() - ref[1]).abs().max().item()]
        errs += [rel(got[i], ref[i]) for i in (2, 3, 4)]
        errs.append(rel(got[5], ref[5]) if c is not None else 0.0)
        good = errs[0] <= 1e-2 and errs[1] <= 1e-3 and max(errs[2:4]) <= tol_dqdk and max(errs[4:]) <= 1e-2
        good = good and not math.isnan(errs[1])
        ok &= good
        name = f"{B} x {T} x {H} x {hd}, {rate if rate else 'none'}, {window}"
        print(f"{name:34s} " + " ".join(f"{e:9.2e}" for e in errs) + ("  ok" if good else "  FAIL"), flush=True)
        del got, ref
        torch.cuda.empty_cache()
    return ok


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def time_shape(fox, B, H, T, hd):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v, dout, c = make_inputs(B, T, H, hd, 0.05)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, device="cuda")
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    dlogf = torch.empty(B, H, T, device="cuda")
    scratch = torch.empty(3 * B * H * T, device="cuda")
    res = {}

    def fox_fwd(cc=c):
        fox.forward(o, lse, q, k, v, cc)

    def fox_fwdbwd(cc=c):
        fox.forward(o, lse, q, k, v, cc)
        fox.backward(dq, dk, dv, dlogf if cc is not None else None, scratch, dout, q, k, v, o, lse, cc)

    res["fox"] = (bench(fox_fwd), bench(fox_fwdbwd))
    res["fox nogate"] = (bench(lambda: fox_fwd(None)), bench(lambda: fox_fwdbwd(None)))

    # peers see (B, H, T, hd) views of the same tensors
    qt, kt, vt, dt = (x.transpose(1, 2) for x in (q, k, v, dout))
    ql, kl, vl = (x.detach().requires_grad_() for x in (qt, kt, vt))
    for name, backend in [("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel([backend]):
                def fwd():
                    return F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)

                def fwdbwd():
                    out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
                    torch.autograd.grad(out, (ql, kl, vl), dt)

                fwd()
                fwdbwd()
                res[name] = (bench(fwd), bench(fwdbwd))
        except Exception as e:  # a backend that cannot take this shape is reported, not fatal
            print(f"  {name}: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
    block_mask = create_block_mask(lambda b, h, qi, kj: qi >= kj, None, None, T, T, device="cuda")
    flex = torch.compile(flex_attention)
    for grad_c in (True, False):  # with d(c) as FoX training needs, and without (c a constant)
        try:
            # inductor cannot index one tensor that needs a gradient twice: c as two leaves,
            # d(c) = d(cq) + d(ck)
            cq = c.detach().requires_grad_(grad_c)
            ck = c.detach().clone().requires_grad_(grad_c)

            def fox_mod(score, b, h, qi, kj):
                return score + cq[b, h, qi] - ck[b, h, kj]

            def ffwd():
                return flex(ql, kl, vl, score_mod=fox_mod, block_mask=block_mask)

            def ffwdbwd():
                out = flex(ql, kl, vl, score_mod=fox_mod, block_mask=block_mask)
                torch.autograd.grad(out, (ql, kl, vl, cq, ck) if grad_c else (ql, kl, vl), dt)

            ffwd()
            ffwdbwd()
            res["flex fox" if grad_c else "flex no dc"] = (bench(ffwd), bench(ffwdbwd))
        except Exception as e:
            print(f"  flex (grad c {grad_c}): unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
    return res


def compare(fox, other, rounds):
    """Two libraries (two trees' kernels) on the same tensors, timed in turn `rounds` times per shape: the
    median of each one's medians, forward and forward+backward with the gate, and the ratio other / fox."""
    print("\nTFLOP/s with the gate, forward+backward (forward alone in brackets), median of %d runs in turn" %
          rounds)
    print(f"{'B x H x T x hd':20s}{'--lib':>16s}{'--compare':>16s}{'ratio':>16s}")
    for B, H, T, hd in SHAPES:
        q, k, v, dout, c = make_inputs(B, T, H, hd, 0.05)
        o, dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lse, dlogf = torch.empty(B, H, T, device="cuda"), torch.empty(B, H, T, device="cuda")
        scratch = torch.empty(3 * B * H * T, device="cuda")
        ms = {0: ([], []), 1: ([], [])}
        for r in range(rounds):  # ABBA: neither library always runs first (clocks drift under the power cap)
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                lib = (fox, other)[i]
                ms[i][0].append(bench(lambda: lib.forward(o, lse, q, k, v, c)))
                ms[i][1].append(bench(lambda: (lib.forward(o, lse, q, k, v, c),
                                               lib.backward(dq, dk, dv, dlogf, scratch, dout, q, k, v, o, lse, c))))
        flops = 2.0 * B * H * T * T * hd
        tf = [(3.5 * flops / statistics.median(ms[i][1]) / 1e9, flops / statistics.median(ms[i][0]) / 1e9)
              for i in (0, 1)]
        cells = ["%.1f (%.1f)" % t for t in tf] + ["%.3f (%.3f)" % (tf[1][0] / tf[0][0], tf[1][1] / tf[0][1])]
        print("%-20s" % f"{B} x {H} x {T} x {hd}" + "".join(f"{x:>16s}" for x in cells), flush=True)
        del q, k, v, dout, c, o, dq, dk, dv, lse, dlogf, scratch
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="an already built libfox_attention.so (skips the build)")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--compare", help="another libfox_attention.so (another tree's kernels): both checked, then "
                    "timed in turn on the same tensors, no peers")
    ap.add_argument("--rounds", type=int, default=6, help="--compare: runs of each per shape, in turn")
    args = ap.parse_args()
    if args.lib:
        global LIB
        LIB = args.lib
    else:
        build()
    fox = Fox()
    if args.compare:
        other = Fox(args.compare)
        print(f"GPU: {torch.cuda.get_device_name()}; --lib {LIB}, --compare {args.compare}")
        if not args.skip_check and not (check(fox) and check(other)):
            print("CHECK FAILED: no timing")
            sys.exit(1)
        compare(fox, other, args.rounds)
        return
    torch._dynamo.config.recompile_limit = 64  # flex recompiles for every shape
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if not args.skip_check and not check(fox):
        print("CHECK FAILED: no timing")
        sys.exit(1)

    rows = []
    for B, H, T, hd in SHAPES:
        print(f"timing {B} x {H} x {T} x {hd}", flush=True)
        res = time_shape(fox, B, H, T, hd)
        rows.append(((B, H, T, hd), res))
        torch.cuda.empty_cache()

    names = ["fox", "fox nogate", "sdpa flash", "sdpa cudnn", "sdpa efficient", "flex fox", "flex no dc"]
    print("\nTFLOP/s, forward+backward (forward alone in brackets); causal, bf16; fox = this kernel with the "
          "gate (dq, dk, dv, dlogf), fox nogate = c NULL; flex fox = FlexAttention FoX score_mod with d(c), "
          "flex no dc = c held constant")
    print(f"{'B x H x T x hd':20s}" + "".join(f"{n:>16s}" for n in names) + f"{'fox/best sdpa':>15s}{'fox/flex':>10s}")
    for (B, H, T, hd), res in rows:
        flops = 2.0 * B * H * T * T * hd  # causal forward
        tf = {n: (flops / (ms[0] * 1e-3) / 1e12, 3.5 * flops / (ms[1] * 1e-3) / 1e12) for n, ms in res.items()}
        line = "%-20s" % f"{B} x {H} x {T} x {hd}"
        for n in names:
            cell = "%.0f (%.0f)" % (tf[n][1], tf[n][0]) if n in tf else "-"
            line += f"{cell:>16s}"
        sdpa = [tf[n] for n in tf if n.startswith("sdpa")]
        if sdpa:
            best = (max(x[0] for x in sdpa), max(x[1] for x in sdpa))
            r = "%.2f (%.2f)" % (tf["fox"][1] / best[1], tf["fox"][0] / best[0])
            line += f"{r:>15s}"
        if "flex fox" in tf:
            r = "%.2f" % (tf["fox"][1] / tf["flex fox"][1])
            line += f"{r:>10s}"
        print(line)


if __name__ == "__main__":
    main()
