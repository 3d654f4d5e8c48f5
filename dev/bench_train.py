"""
End-to-end training throughput of train_fox against the same model in PyTorch.

    python dev/bench_train.py                       # every configuration below, both trainers
    python dev/bench_train.py --configs 125m-2k --steps 30
    python dev/bench_train.py --skip-torch          # train_fox alone

For each configuration it runs ./train_fox (built beforehand: make train_fox) on the default
corpus and the same model in PyTorch (bf16 autocast, FlexAttention with a FoX score_mod for the
forget gate, fused AdamW, global-norm clipping, torch.compile), on random token ids, and prints
tokens/s, MFU and peak GPU memory of each, and the ratio train_fox / PyTorch.

Timing: the median step time after warm-up steps (the compile of torch.compile and cuBLASLt's
first plans are excluded). MFU = (6*N + 6*L*C*T) * tokens/s / 989 TFLOP/s, N = parameters that
take part in matmuls (dev/fox.md, "FLOP and MFU conventions"); the inputs of the formula are printed.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
from fox_reference import resolve_config  # noqa: E402  (the presets, one source of truth)

PEAK_FLOPS = 989e12  # H100 SXM / H200 dense bf16
# name: (preset, overrides, micro-batch B, context T)
CONFIGS = {
    "125m-2k": ("fox-pro", dict(n_layer=12, n_embd=768, n_head=12), 16, 2048),
    "125m-16k": ("fox-pro", dict(n_layer=12, n_embd=768, n_head=12), 2, 16384),
    "760m-16k": ("fox-pro", dict(n_layer=24, n_embd=1536, n_head=24), 1, 16384),
}
TRAIN_FOX_PRESET = {"125m-2k": "fox-pro-125m", "125m-16k": "fox-pro-125m", "760m-16k": "fox-pro-760m"}
VOCAB = 50257
PADDED_VOCAB = 50304


# ----------------------------------------------------------------------------
# the model in PyTorch, written for speed (the float64 dev/fox_reference.py is the one for truth)

class ShiftedProjection(nn.Module):
    # y_t = a_t y~_{t-1} + (1 - a_t) y~_t per head, a_t = sigmoid(w_s . x_t)
    def __init__(self, C, H, shift):
        super().__init__()
        self.linear = nn.Linear(C, C, bias=False)
        self.shift_proj = nn.Linear(C, H, bias=False) if shift else None
        self.H = H

    def forward(self, x):
        y = self.linear(x)
        if self.shift_proj is None:
            return y
        B, T, C = y.shape
        a = torch.sigmoid(self.shift_proj(x)).unsqueeze(-1)  # (B, T, H, 1)
        y = y.view(B, T, self.H, C // self.H)
        prev = F.pad(y, (0, 0, 0, 0, 1, 0))[:, :-1]
        return (a * prev + (1 - a) * y).reshape(B, T, C)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, H = cfg["n_embd"], cfg["n_head"]
        self.H, self.hd, self.cfg = H, C // H, cfg
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj = ShiftedProjection(C, H, cfg["k_shift"])
        self.v_proj = ShiftedProjection(C, H, cfg["v_shift"])
        self.fgate_proj = nn.Linear(C, H, bias=True) if cfg["gate"] != "none" else None
        n = self.hd if cfg["qk_norm_shared"] else C
        self.q_norm = nn.Parameter(torch.ones(n)) if cfg["qk_norm"] else None
        self.k_norm = nn.Parameter(torch.ones(n)) if cfg["qk_norm"] else None
        self.ogate_proj = nn.Linear(C, C, bias=False) if cfg["output_gate"] else None
        self.output_norm = nn.Parameter(torch.ones(C)) if cfg["output_norm"] else None
        self.o_proj = nn.Linear(C, C, bias=False)

    def head_norm(self, x, w, eps):  # x (B, H, T, hd)
        return F.rms_norm(x, (self.hd,), eps=eps) * w.view(-1, 1, self.hd).to(x.dtype)

    def forward(self, x, block_mask):
        from torch.nn.attention.flex_attention import flex_attention
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.H, self.hd).transpose(1, 2)  # (B, H, T, hd)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if self.q_norm is not None:
            q, k = self.head_norm(q, self.q_norm, 1e-5), self.head_norm(k, self.k_norm, 1e-5)
        if self.fgate_proj is not None:
            c = torch.cumsum(F.logsigmoid(self.fgate_proj(x).float()).transpose(1, 2), dim=-1)  # (B, H, T)
            # inductor indexes each captured tensor that needs a gradient once: two copies of c
            cq, ck = c, c.clone()
            o = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + cq[b, h, i] - ck[b, h, j],
                               block_mask=block_mask)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.output_norm is not None:
            o = F.rms_norm(o, (self.hd,), eps=1e-6) * self.output_norm.view(self.H, 1, self.hd).to(o.dtype)
        o = o.transpose(1, 2).reshape(B, T, C)
        if self.ogate_proj is not None:
            o = o * torch.sigmoid(self.ogate_proj(x))
        return self.o_proj(o)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, I = cfg["n_embd"], cfg["mlp_hidden"]
        self.attn_norm = nn.RMSNorm(C, eps=1e-6)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(C, eps=1e-6)
        self.gate_proj = nn.Linear(C, 2 * I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)
        self.I = I

    def forward(self, h, block_mask):
        h = h + self.attn(self.attn_norm(h), block_mask)
        gu = self.gate_proj(self.mlp_norm(h))
        return h + self.down_proj(F.silu(gu[..., :self.I]) * gu[..., self.I:])


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.embeddings = nn.Embedding(PADDED_VOCAB, C)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"]))
        self.norm = nn.RMSNorm(C, eps=1e-6)
        self.lm_head = nn.Linear(C, PADDED_VOCAB, bias=False)

    def forward(self, idx, targets, block_mask):
        h = self.embeddings(idx)
        for layer in self.layers:
            h = layer(h, block_mask)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def matmul_params(model):
    return sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embeddings" not in n)


def torch_run(name, steps, warmup):
    from torch.nn.attention.flex_attention import create_block_mask
    preset, over, B, T = CONFIGS[name]
    cfg = resolve_config(preset, dict(over, vocab_size=VOCAB))
    torch.manual_seed(0)
    model = Model(cfg).cuda()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device="cuda")
    # a fresh compile per configuration with static shapes: after an earlier configuration in the
    # same process, the 16k configurations ran about 5x slower (a recompile with a symbolic T)
    torch._dynamo.reset()
    step_fn = torch.compile(model, dynamic=False)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):
        idx = torch.randint(0, VOCAB, (B, T), device="cuda")
        tgt = torch.randint(0, VOCAB, (B, T), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx, tgt, block_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    return dict(tok_s=B * T / dt, peak_mib=torch.cuda.max_memory_allocated() / 2**20, n_matmul=matmul_params(model),
                cfg=cfg, B=B, T=T)


# ----------------------------------------------------------------------------
# train_fox

def train_fox_run(name, steps, warmup, binary, extra):
    preset, over, B, T = CONFIGS[name]
    cmd = [binary, "-e", TRAIN_FOX_PRESET[name], "-b", str(B), "-t", str(T), "-x", str(warmup + steps),
           "-v", "0", "-s", "0"] + extra
    print("  $ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        return dict(error=(out.stdout + out.stderr).strip().splitlines()[-1:])
    text = out.stdout
    ms = [float(m) for m in re.findall(r"\| ([\d.]+) ms \|", text)][warmup:]
    peak = re.search(r"peak GPU memory ([\d.]+) MiB", text)
    estimate = re.search(r"GPU memory estimate ([\d.]+) MiB", text)
    n_matmul = re.search(r"parameters: \d+ \((\d+) in matmuls\)", text)
    dt = statistics.median(ms) / 1e3
    return dict(tok_s=B * T / dt, peak_mib=float(peak.group(1)) if peak else None,
                estimate_mib=float(estimate.group(1)) if estimate else None,
                n_matmul=int(n_matmul.group(1)), B=B, T=T)


def mfu(r, cfg_over):
    n_layer, n_embd = cfg_over["n_layer"], cfg_over["n_embd"]
    flops = 6.0 * r["n_matmul"] + 6.0 * n_layer * n_embd * r["T"]
    return 100.0 * flops * r["tok_s"] / PEAK_FLOPS, flops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated from: " + ", ".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--binary", default="./train_fox")
    ap.add_argument("--train-fox-args", default="", help="extra flags for train_fox, e.g. '-r 1'")
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    names = args.configs.split(",")
    for n in names:
        if n not in CONFIGS:
            sys.exit(f"error: unknown configuration {n}. HINT: choose from {', '.join(CONFIGS)}")
    torch._dynamo.config.cache_size_limit = 64
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    for n in names:
        print(f"{n}:", flush=True)
        ours = train_fox_run(n, args.steps, args.warmup, args.binary, args.train_fox_args.split())
        print(f"  train_fox: {ours}", flush=True)
        theirs = None
        if not args.skip_torch:
            try:
                theirs = torch_run(n, args.steps, args.warmup)
                print(f"  pytorch: tok/s {theirs['tok_s']:.0f}, peak {theirs['peak_mib']:.0f} MiB", flush=True)
            except torch.OutOfMemoryError:
                theirs = dict(error="out of memory")
                print("  pytorch: out of memory", flush=True)
            torch.cuda.empty_cache()
        rows.append((n, ours, theirs))

    print("\n| config | B x T | train_fox tok/s | MFU | peak MiB (estimate) | PyTorch tok/s | MFU | peak MiB | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, ours, theirs in rows:
        over = CONFIGS[n][1]
        _, _, B, T = CONFIGS[n]
        if "error" in ours:
            ours_cols = [f"failed: {ours['error']}", "", ""]
        else:
            m, flops = mfu(ours, over)
            peak = f"{ours['peak_mib']:.0f}" if ours["peak_mib"] else "n/a"
            est = f"{ours['estimate_mib']:.0f}" if ours["estimate_mib"] else "n/a"
            ours_cols = [f"{ours['tok_s']:,.0f}", f"{m:.1f}%", f"{peak} ({est})"]
        if theirs is None or "error" in theirs:
            theirs_cols = [theirs["error"] if theirs else "skipped", "", ""]
            ratio = ""
        else:
            tm, _ = mfu(theirs, over)
            theirs_cols = [f"{theirs['tok_s']:,.0f}", f"{tm:.1f}%", f"{theirs['peak_mib']:.0f}"]
            ratio = f"{ours['tok_s'] / theirs['tok_s']:.2f}x" if "error" not in ours else ""
        print(f"| {n} | {B} x {T} | " + " | ".join(ours_cols) + " | " + " | ".join(theirs_cols) + f" | {ratio} |")
    print(f"\nMFU: (6*N + 6*L*C*T) * tokens/s / {PEAK_FLOPS / 1e12:.0f} TFLOP/s, N = parameters in matmuls")


if __name__ == "__main__":
    main()
