#!/usr/bin/env python3
"""
Independent PyTorch reference of the Forgetting Transformer (FoX), written from dev/fox.md
independently of the C code, in float64. For a config and a seed it writes a debug-state file (.fxds,
see compare_debug_states.py): the parameters, a batch, the logits, the loss, every gradient, and N
AdamW steps on that batch.
The C and CUDA trainers are diffed against these files.

  python3 dev/fox_reference.py --all --out dev/fixtures          # every fixture
  python3 dev/fox_reference.py --preset fox-pro --set window=8 --out x.fxds
  python3 dev/fox_reference.py --fixture fox-pro-window8 --out x.fxds
  python3 dev/fox_reference.py --self-test                       # finite differences, causality

Presets: fox-pro, fox-llama, transformer-pro, transformer-llama, on small defaults (2 layers,
C = 32, 2 heads, V = 64, B = 2, T = 24) with the MLP size from the model document's formula. A fixture is a
preset plus mlp_hidden = 64, its own seed and its own overrides; --set applies on top of either.
documents=1 keeps documents apart (train_fox -f 1): the token eot (default V - 1) starts a document that
sees nothing before it; the batch then holds EOTs at fixed positions (DOC_EOTS).
Parameters use a test initialisation (not the paper's): large enough that every path matters,
drawn from splitmix64 so that the files do not depend on the torch or numpy version.
Runs on PyTorch 1.13 and 2.x (basic ops only).
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from compare_debug_states import read_debug_state, write_debug_state

# ----------------------------------------------------------------------------
# configuration

# (key, type) in the order of the config record; booleans are ints 0/1
CONFIG_KEYS = [
    ("n_layer", int), ("n_embd", int), ("n_head", int), ("vocab_size", int), ("mlp_hidden", int),
    ("block", str), ("gate", str), ("decay_time_min", float), ("decay_time_max", float),
    ("k_shift", int), ("v_shift", int), ("qk_norm", int), ("qk_norm_shared", int),
    ("output_gate", int), ("output_norm", int), ("rope", int), ("rope_theta", float),
    ("window", int), ("batch", int), ("seq_len", int), ("seed", int), ("lr", float),
    ("weight_decay", float), ("beta1", float), ("beta2", float), ("adam_eps", float),
    ("grad_clip", float), ("warmup_tokens", int), ("total_tokens", int), ("schedule", str),
    ("n_steps", int), ("documents", int), ("eot", int),
]
# written into a fixture's config record only when documents=1, so the other fixtures' records stay as they are
DOCUMENT_KEYS = ("documents", "eot")
BOOL_KEYS = ["k_shift", "v_shift", "qk_norm", "qk_norm_shared", "output_gate", "output_norm", "rope"]

# None = derived in resolve_config: mlp_hidden from dev/fox.md's formula, warmup 2 steps, total 10
DEFAULTS = dict(
    n_layer=2, n_embd=32, n_head=2, vocab_size=64, mlp_hidden=None, block="pro", gate="full",
    decay_time_min=2.0, decay_time_max=128.0, k_shift=1, v_shift=1, qk_norm=1, qk_norm_shared=0,
    output_gate=1, output_norm=1, rope=0, rope_theta=500000.0, window=0, batch=2, seq_len=24,
    seed=1337, lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8, grad_clip=1.0,
    warmup_tokens=None, total_tokens=None, schedule="cosine", n_steps=10, documents=0, eot=None,
)

PRO_ON = dict(block="pro", k_shift=1, v_shift=1, qk_norm=1, output_gate=1, output_norm=1)
PRO_OFF = dict(block="llama", k_shift=0, v_shift=0, qk_norm=0, output_gate=0, output_norm=0)
PRESETS = {
    "fox-pro": dict(PRO_ON, gate="full", rope=0),
    "fox-llama": dict(PRO_OFF, gate="full", rope=0),
    "transformer-pro": dict(PRO_ON, gate="none", rope=1),
    "transformer-llama": dict(PRO_OFF, gate="none", rope=1),
}

# (file name, preset, overrides); every fixture also gets mlp_hidden=64, and its own seed
FIXTURES = [
    ("fox-pro", "fox-pro", dict(seed=101)),
    ("fox-llama", "fox-llama", dict(seed=102)),
    ("transformer-pro", "transformer-pro", dict(seed=103)),
    ("transformer-llama", "transformer-llama", dict(seed=104)),
    ("fox-pro-gate-bias_only", "fox-pro", dict(seed=105, gate="bias_only")),
    ("fox-pro-gate-fixed", "fox-pro", dict(seed=106, gate="fixed")),
    ("fox-llama-gate-bias_only", "fox-llama", dict(seed=107, gate="bias_only")),
    ("fox-pro-window8", "fox-pro", dict(seed=108, window=8)),
    ("transformer-llama-window8", "transformer-llama", dict(seed=109, window=8)),
    ("fox-pro-no-kshift", "fox-pro", dict(seed=110, k_shift=0)),
    ("fox-pro-no-vshift", "fox-pro", dict(seed=111, v_shift=0)),
    ("fox-pro-no-qknorm", "fox-pro", dict(seed=112, qk_norm=0)),
    ("fox-pro-qknorm-shared", "fox-pro", dict(seed=113, qk_norm_shared=1)),
    ("fox-pro-no-ogate", "fox-pro", dict(seed=114, output_gate=0)),
    ("fox-pro-no-onorm", "fox-pro", dict(seed=115, output_norm=0)),
    ("fox-llama-rope", "fox-llama", dict(seed=116, rope=1)),
    ("fox-pro-linear-schedule", "fox-pro", dict(seed=117, schedule="linear", warmup_tokens=0)),
    ("fox-pro-documents", "fox-pro", dict(seed=118, documents=1)),
    ("transformer-llama-documents", "transformer-llama", dict(seed=119, documents=1)),
    ("fox-pro-documents-window8", "fox-pro", dict(seed=120, documents=1, window=8)),
]
# EOT positions of sequence b (b even, b odd) in a documents batch, those below T: sequence 0 starts with a
# document, holds an empty one (EOT EOT at 6, 7), one of a single token (7-8) and ends on a lone EOT; sequence 1
# starts in the middle of a document
DOC_EOTS = ([0, 6, 7, 9, 17, 23], [11, 12, 20])
FIXTURE_BASE = dict(mlp_hidden=64)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def mlp_hidden_size(n_embd, block):
    # I = 256 * ceil(floor(C * r * 2/3) / 256), r = 4 (llama) or 3.5 (pro), in integers
    inner = (8 * n_embd) // 3 if block == "llama" else (7 * n_embd) // 3
    return 256 * ((inner + 255) // 256)


def resolve_config(preset, overrides):
    if preset not in PRESETS:
        fail(f"unknown preset {preset}. HINT: use one of {', '.join(PRESETS)}, or --fixture NAME")
    cfg = dict(DEFAULTS)
    cfg.update(PRESETS[preset])
    cfg.update(overrides)
    tokens_per_step = cfg["batch"] * cfg["seq_len"]
    if cfg["mlp_hidden"] is None:
        cfg["mlp_hidden"] = mlp_hidden_size(cfg["n_embd"], cfg["block"])
    if cfg["warmup_tokens"] is None:
        cfg["warmup_tokens"] = 2 * tokens_per_step
    if cfg["total_tokens"] is None:
        cfg["total_tokens"] = 10 * tokens_per_step
    if cfg["eot"] is None:
        cfg["eot"] = cfg["vocab_size"] - 1
    validate_config(cfg)
    return cfg


def validate_config(cfg):
    choices = dict(block=("llama", "pro"), gate=("full", "bias_only", "fixed", "none"),
                   schedule=("cosine", "linear", "constant"))
    for key, allowed in choices.items():
        if cfg[key] not in allowed:
            fail(f"{key}={cfg[key]} is not valid. HINT: use one of {', '.join(allowed)}")
    for key in BOOL_KEYS + ["documents"]:
        if cfg[key] not in (0, 1):
            fail(f"{key}={cfg[key]} must be 0 or 1. HINT: --set {key}=1")
    for key in ("n_layer", "n_embd", "n_head", "vocab_size", "mlp_hidden", "batch", "seq_len", "n_steps"):
        if cfg[key] < 1:
            fail(f"{key}={cfg[key]} must be at least 1. HINT: check the --set values")
    if cfg["n_embd"] % cfg["n_head"] != 0:
        fail(f"n_embd={cfg['n_embd']} is not a multiple of n_head={cfg['n_head']}. "
             "HINT: the head size is n_embd / n_head")
    if cfg["rope"] and (cfg["n_embd"] // cfg["n_head"]) % 2 != 0:
        fail("RoPE needs an even head size. HINT: change n_embd or n_head, or --set rope=0")
    if cfg["qk_norm_shared"] and not cfg["qk_norm"]:
        fail("qk_norm_shared=1 needs qk_norm=1. HINT: --set qk_norm=1")
    if not 0 <= cfg["eot"] < cfg["vocab_size"]:
        fail(f"eot={cfg['eot']} is not a token of the vocabulary. HINT: leave it out (V - 1)")
    if cfg["window"] < 0:
        fail(f"window={cfg['window']} is negative. HINT: 0 turns the sliding window off")
    if not 0 < cfg["decay_time_min"] <= cfg["decay_time_max"]:
        fail("need 0 < decay_time_min <= decay_time_max. HINT: the paper uses 2 and 128")
    if not 0 <= cfg["warmup_tokens"] < cfg["total_tokens"]:
        fail(f"need 0 <= warmup_tokens ({cfg['warmup_tokens']}) < total_tokens ({cfg['total_tokens']}). "
             "HINT: the decay phase must have positive length")


def parse_overrides(items):
    types = dict(CONFIG_KEYS)
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            fail(f"bad --set {item}. HINT: use key=value with a key from: {' '.join(types)}")
        try:
            overrides[key] = types[key](value)
        except ValueError:
            fail(f"bad value in --set {item}. HINT: {key} takes a {types[key].__name__}")
    return overrides


def config_text(cfg):
    # one key=value line per key; floats as Python's repr (shortest round trip), ints as decimal
    keys = [(k, kind) for k, kind in CONFIG_KEYS if cfg["documents"] or k not in DOCUMENT_KEYS]
    return "".join(f"{key}={repr(float(cfg[key])) if kind is float else cfg[key]}\n" for key, kind in keys)


# ----------------------------------------------------------------------------
# deterministic test initialisation

MASK64 = (1 << 64) - 1
INIT_GAIN = 1.7  # matrix std = INIT_GAIN / sqrt(fan_in): 0.3 at C = 32; peaked attention, saturating gates


class SplitMix64:
    # plain Python integers and floats, so the draws do not depend on the torch or numpy version
    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        # in (0, 1): never 0, so Box-Muller's log stays finite
        return ((self.next_u64() >> 11) + 0.5) * 2.0 ** -53

    def normal(self):
        u1, u2 = self.uniform(), self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def below(self, n):
        return self.next_u64() % n


def param_specs(cfg):
    # (name, shape, init, decay, trainable) in file order; decay = in the weight decay group
    C, H, I, V = cfg["n_embd"], cfg["n_head"], cfg["mlp_hidden"], cfg["vocab_size"]
    hd = C // H
    specs = [("model.embeddings.weight", (V, C), "embedding", True, True)]
    for i in range(cfg["n_layer"]):
        p = f"model.layers.{i}."
        specs.append((p + "attn_norm.weight", (C,), "scale", False, True))
        specs.append((p + "attn.q_proj.weight", (C, C), "matrix", True, True))
        for kv, shifted in (("k", cfg["k_shift"]), ("v", cfg["v_shift"])):
            if shifted:
                specs.append((p + f"attn.{kv}_proj.linear.weight", (C, C), "matrix", True, True))
                specs.append((p + f"attn.{kv}_proj.shift_proj.weight", (H, C), "matrix", True, True))
            else:
                specs.append((p + f"attn.{kv}_proj.weight", (C, C), "matrix", True, True))
        if cfg["gate"] == "full":
            specs.append((p + "attn.fgate_proj.weight", (H, C), "matrix", True, True))
            specs.append((p + "attn.fgate_proj.bias", (H,), "gate_bias", False, True))
        elif cfg["gate"] in ("bias_only", "fixed"):
            specs.append((p + "attn.fgate_bias", (H,), "decay_time_bias", False, cfg["gate"] == "bias_only"))
        if cfg["qk_norm"]:
            n = hd if cfg["qk_norm_shared"] else C
            specs.append((p + "attn.q_norm.weight", (n,), "scale", False, True))
            specs.append((p + "attn.k_norm.weight", (n,), "scale", False, True))
        if cfg["output_gate"]:
            specs.append((p + "attn.ogate_proj.weight", (C, C), "matrix", True, True))
        if cfg["output_norm"]:
            specs.append((p + "attn.output_norm.weight", (C,), "scale", False, True))
        specs.append((p + "attn.o_proj.weight", (C, C), "matrix", True, True))
        specs.append((p + "mlp_norm.weight", (C,), "scale", False, True))
        specs.append((p + "mlp.gate_proj.weight", (2 * I, C), "matrix", True, True))
        specs.append((p + "mlp.down_proj.weight", (C, I), "matrix", True, True))
    specs.append(("model.norm.weight", (C,), "scale", False, True))
    specs.append(("lm_head.weight", (V, C), "matrix", True, True))
    return specs


def decay_time_bias(n_head, t_min, t_max):
    # log sigmoid(b) = -1/T for b = -log(expm1(1/T)); T log-spaced from t_min to t_max over heads
    biases = []
    for h in range(n_head):
        frac = h / (n_head - 1) if n_head > 1 else 0.0
        t = math.exp(math.log(t_min) + frac * (math.log(t_max) - math.log(t_min)))
        biases.append(-math.log(math.expm1(1.0 / t)))
    return biases


def init_params(cfg, specs, rng):
    # float32 values (exactly what the file stores), drawn in file order from one stream
    params = {}
    for name, shape, init, _, _ in specs:
        n = int(np.prod(shape))
        if init == "embedding":
            values = [rng.normal() for _ in range(n)]
        elif init == "matrix":
            std = INIT_GAIN / math.sqrt(shape[1])
            values = [std * rng.normal() for _ in range(n)]
        elif init == "scale":
            values = [1.0 + 0.1 * rng.normal() for _ in range(n)]
        elif init == "gate_bias":
            values = [rng.normal() + 2.0 for _ in range(n)]  # gates mostly near 1, but varied
        else:
            values = decay_time_bias(cfg["n_head"], cfg["decay_time_min"], cfg["decay_time_max"])
        params[name] = np.array(values, dtype=np.float64).astype(np.float32).reshape(shape)
    return params


def random_ids(rng, shape, vocab_size):
    return np.array([rng.below(vocab_size) for _ in range(int(np.prod(shape)))], dtype=np.int32).reshape(shape)


def document_inputs(rng, cfg):
    # ids below eot (none is an EOT by chance; eot = V - 1 by default), then the EOTs of DOC_EOTS
    B, T, eot = cfg["batch"], cfg["seq_len"], cfg["eot"]
    inputs = random_ids(rng, (B, T), eot)
    for b in range(B):
        for t in DOC_EOTS[b % 2]:
            if t < T:
                inputs[b, t] = eot
    return inputs


def build(cfg):
    # returns (specs, float32 params, torch float64 params, inputs, targets)
    specs = param_specs(cfg)
    rng = SplitMix64(cfg["seed"])
    init = init_params(cfg, specs, rng)
    shape = (cfg["batch"], cfg["seq_len"])
    inputs = document_inputs(rng, cfg) if cfg["documents"] else random_ids(rng, shape, cfg["vocab_size"])
    targets = random_ids(rng, shape, cfg["vocab_size"])
    P = {name: torch.tensor(init[name], dtype=torch.float64).requires_grad_(trainable)
         for name, _, _, _, trainable in specs}
    return specs, init, P, inputs, targets


# ----------------------------------------------------------------------------
# model

def rmsnorm(x, w, eps):
    # over the last dim; x (..., C), w (C)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def head_rmsnorm(x, w, eps):
    # x (B, H, T, hd); w (H*hd), each head its own hd scales, or (hd) shared by all heads
    hd = x.shape[-1]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.view(-1, 1, hd)


def document_starts(inputs, eot):
    # doc (B, T): the position of the first token (the EOT) of the document of each token; 0 when the document
    # began at or before the sequence's start
    B, T = inputs.shape
    doc = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        for t in range(1, T):
            doc[b, t] = t if inputs[b, t] == eot else doc[b, t - 1]
    return torch.as_tensor(doc)


def kv_shift(y, x, w_shift, n_head, doc):
    # y (B, T, C) the projected k~ or v~, x (B, T, C) the layer input, w_shift (H, C), doc (B, T)
    # y_t <- a_t y~_{t-1} + (1 - a_t) y~_t per head, a_t = sigmoid(w_s . x_t), y~_{-1} = 0 and y~_{t-1} = 0 where a
    # document starts at t
    B, T, C = y.shape
    a = torch.sigmoid(x @ w_shift.t()).unsqueeze(-1)  # (B, T, H, 1)
    y = y.view(B, T, n_head, C // n_head)
    prev = torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)
    prev = prev * (doc != torch.arange(T)).to(y.dtype).view(B, T, 1, 1)
    return (a * prev + (1 - a) * y).reshape(B, T, C)


def rope(x, theta):
    # x (B, H, T, hd); non-interleaved: pair (i, i + hd/2) turns by angle t * theta^(-2i/hd)
    T, hd = x.shape[2], x.shape[3]
    half = hd // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, hd/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def log_forget(cfg, P, pre, x):
    # log f, (B, H, T)
    B, T, _ = x.shape
    H = cfg["n_head"]
    if cfg["gate"] == "full":
        return F.logsigmoid(x @ P[pre + "fgate_proj.weight"].t() + P[pre + "fgate_proj.bias"]).transpose(1, 2)
    if cfg["gate"] in ("bias_only", "fixed"):
        return F.logsigmoid(P[pre + "fgate_bias"]).view(1, H, 1).expand(B, H, T)
    return torch.zeros(B, H, T, dtype=x.dtype)


def attention_mask(T, window, doc):
    # (B, 1, T, T) True where query i may attend key j: j <= i, i - window < j when the window is on, and j in
    # i's document (doc (B, T): j >= doc_i)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = j <= i
    if window > 0:
        allowed = allowed & (j > i - window)
    return (allowed[None] & (j[None] >= doc[:, :, None]))[:, None]


def document_cumsum(logf, doc):
    # c_t = sum of log f_s over s <= t in t's document, less its start when that is t0 > 0 (a forget gate of -inf:
    # c_t0 = 0 and log f_t0 takes no part): (B, H, T) through the 0/1 matrix M_ts = [doc_t <= s <= t, s != t0 > 0]
    T = logf.shape[-1]
    s = torch.arange(T)[None, None, :]
    t = torch.arange(T)[None, :, None]
    start = doc[:, :, None]
    M = ((s <= t) & (s >= start) & ~((s == start) & (start > 0))).to(logf.dtype)  # (B, T, T)
    return torch.einsum("bts,bhs->bht", M, logf)


def attention(cfg, P, pre, x, logf_delta, doc):
    # x (B, T, C) the normed stream; logf_delta (B, H, T) or None is added to log f (for tests); doc (B, T) the
    # document starts (all 0 when documents are not kept apart: one document a sequence)
    B, T, C = x.shape
    H = cfg["n_head"]
    hd = C // H
    q = x @ P[pre + "q_proj.weight"].t()
    proj = {}
    for kv in ("k", "v"):
        if cfg[f"{kv}_shift"]:
            y = x @ P[pre + f"{kv}_proj.linear.weight"].t()
            proj[kv] = kv_shift(y, x, P[pre + f"{kv}_proj.shift_proj.weight"], H, doc)
        else:
            proj[kv] = x @ P[pre + f"{kv}_proj.weight"].t()

    def heads(t):
        return t.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
    q, k, v = heads(q), heads(proj["k"]), heads(proj["v"])
    if cfg["qk_norm"]:
        q = head_rmsnorm(q, P[pre + "q_norm.weight"], 1e-5)
        k = head_rmsnorm(k, P[pre + "k_norm.weight"], 1e-5)
    if cfg["rope"]:
        q = rope(q, cfg["rope_theta"])
        k = rope(k, cfg["rope_theta"])
    logf = log_forget(cfg, P, pre, x)
    if logf_delta is not None:
        logf = logf + logf_delta
    c = torch.cumsum(logf, dim=-1) if not cfg["documents"] else document_cumsum(logf, doc)  # (B, H, T)
    s = q @ k.transpose(-2, -1) / math.sqrt(hd) + c[..., :, None] - c[..., None, :]  # (B, H, T, T)
    # mask before exp: above the diagonal c_i - c_j > 0 can be huge
    s = s.masked_fill(~attention_mask(T, cfg["window"], doc), float("-inf"))
    o = torch.softmax(s, dim=-1) @ v  # (B, H, T, hd)
    if cfg["output_norm"]:
        o = head_rmsnorm(o, P[pre + "output_norm.weight"], 1e-6)
    o = o.transpose(1, 2).reshape(B, T, C)
    if cfg["output_gate"]:
        o = o * torch.sigmoid(x @ P[pre + "ogate_proj.weight"].t())
    return o @ P[pre + "o_proj.weight"].t()


def mlp(cfg, P, pre, x):
    # SwiGLU; gate_proj holds the gate rows first, then the up rows
    I = cfg["mlp_hidden"]
    gu = x @ P[pre + "gate_proj.weight"].t()  # (B, T, 2I)
    return (F.silu(gu[..., :I]) * gu[..., I:]) @ P[pre + "down_proj.weight"].t()


def forward(cfg, P, inputs, targets, logf_deltas=None):
    # inputs, targets (B, T) int; returns logits (B, T, V) and the mean cross-entropy
    h = P["model.embeddings.weight"][torch.as_tensor(inputs, dtype=torch.long)]  # (B, T, C)
    eot = cfg["eot"] if cfg["documents"] else -1  # -1: no token starts a document
    doc = document_starts(inputs, eot)
    for i in range(cfg["n_layer"]):
        pre = f"model.layers.{i}."
        delta = logf_deltas[i] if logf_deltas is not None else None
        h = h + attention(cfg, P, pre + "attn.", rmsnorm(h, P[pre + "attn_norm.weight"], 1e-6), delta, doc)
        h = h + mlp(cfg, P, pre + "mlp.", rmsnorm(h, P[pre + "mlp_norm.weight"], 1e-6))
    logits = rmsnorm(h, P["model.norm.weight"], 1e-6) @ P["lm_head.weight"].t()
    V = cfg["vocab_size"]
    loss = F.cross_entropy(logits.reshape(-1, V), torch.as_tensor(targets, dtype=torch.long).reshape(-1))
    return logits, loss


# ----------------------------------------------------------------------------
# optimiser

def learning_rate(cfg, step):
    # tokens-driven: linear warmup, then cosine / linear / constant to total_tokens
    D = cfg["batch"] * cfg["seq_len"]
    W, total, peak = cfg["warmup_tokens"], cfg["total_tokens"], cfg["lr"]
    t_before, t_after = step * D, (step + 1) * D
    if t_before < W:
        return peak * min(1.0, t_after / W)
    progress = min(1.0, (t_before - W) / (total - W))
    if cfg["schedule"] == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg["schedule"] == "linear":
        return peak * (1.0 - progress)
    return peak


def train(cfg, specs, P, inputs, targets):
    # n_steps of AdamW on the same batch, written out (not torch.optim) so torch versions agree;
    # returns the first forward's logits, loss and gradients, and the per-step history
    trainable = [(name, decay) for name, _, _, decay, is_trainable in specs if is_trainable]
    m = {name: torch.zeros_like(P[name]) for name, _ in trainable}
    v = {name: torch.zeros_like(P[name]) for name, _ in trainable}
    b1, b2, eps, wd = cfg["beta1"], cfg["beta2"], cfg["adam_eps"], cfg["weight_decay"]
    history = dict(lr=[], loss=[], grad_norm=[], clipped=0)
    for step in range(cfg["n_steps"]):
        logits, loss = forward(cfg, P, inputs, targets)
        loss.backward()
        if step == 0:
            first = dict(logits=logits.detach().clone(), loss=loss.item(),
                         grads={name: P[name].grad.clone() for name, _ in trainable})
        with torch.no_grad():
            norm = math.sqrt(sum(float((P[name].grad ** 2).sum()) for name, _ in trainable))
            coef = cfg["grad_clip"] / (norm + 1e-6)
            lr = learning_rate(cfg, step)
            for name, decay in trainable:
                p, g = P[name], P[name].grad
                if coef < 1.0:
                    g = g * coef
                if decay:
                    p -= lr * wd * p
                m[name] = b1 * m[name] + (1 - b1) * g
                v[name] = b2 * v[name] + (1 - b2) * g * g
                m_hat = m[name] / (1 - b1 ** (step + 1))
                v_hat = v[name] / (1 - b2 ** (step + 1))
                p -= lr * m_hat / (torch.sqrt(v_hat) + eps)
                p.grad = None
        history["lr"].append(lr)
        history["loss"].append(loss.item())
        history["grad_norm"].append(norm)
        history["clipped"] += int(coef < 1.0)
    return first, history


def run_reference(cfg, path):
    specs, init, P, inputs, targets = build(cfg)
    first, history = train(cfg, specs, P, inputs, targets)
    records = [("config", config_text(cfg))]
    records += [(name, init[name]) for name, _, _, _, _ in specs]
    records += [("inputs", inputs), ("targets", targets)]
    records += [("logits", first["logits"].numpy()), ("loss", np.array([first["loss"]], dtype=np.float64))]
    records += [(f"grad.{name}", g.numpy()) for name, g in first["grads"].items()]
    for key in ("lr", "loss", "grad_norm"):
        records.append((f"step_{key}", np.array(history[key], dtype=np.float64)))
    write_debug_state(path, records)
    return first, history


# ----------------------------------------------------------------------------
# self-test: finite differences, causality and window, init facts, file round trip

class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def fixture_config(name, extra=None):
    # the config of fixture name, with extra overrides on top
    for fixture, preset, overrides in FIXTURES:
        if fixture == name:
            return resolve_config(preset, {**FIXTURE_BASE, **overrides, **(extra or {})})
    fail(f"unknown fixture {name}. HINT: use one of {', '.join(f[0] for f in FIXTURES)}")


def loss_at(cfg, P, inputs, targets, deltas):
    with torch.no_grad():
        return forward(cfg, P, inputs, targets, deltas)[1].item()


def finite_difference_errors(cfg, P, inputs, targets, deltas, tensor, grad, rng, n_entries, h):
    # central differences on n_entries random entries whose |grad| >= 0.1 max|grad| (smaller ones
    # drown in the loss's rounding noise, ~1e-16 * loss / h); returns the relative errors
    flat_grad = grad.reshape(-1)
    candidates = torch.nonzero(flat_grad.abs() >= 0.1 * flat_grad.abs().max()).reshape(-1).tolist()
    errors = []
    flat = tensor.detach().view(-1)
    for _ in range(n_entries):
        idx = candidates[rng.below(len(candidates))]
        saved = flat[idx].item()
        flat[idx] = saved + h
        up = loss_at(cfg, P, inputs, targets, deltas)
        flat[idx] = saved - h
        down = loss_at(cfg, P, inputs, targets, deltas)
        flat[idx] = saved
        fd = (up - down) / (2 * h)
        errors.append(abs(fd - flat_grad[idx].item()) / abs(flat_grad[idx].item()))
    return errors


def check_gradients(checks, name, cfg, n_entries=3, h=1e-5, tol=1e-6):
    # autograd vs central differences for every trainable tensor and for log f of every layer.
    # h = 1e-5: at 1e-6 the loss's rounding noise (~1e-16 * loss / h) gives errors up to 7e-7;
    # at 1e-5 the worst is ~5e-8, and the O(h^2) truncation error stays below that.
    specs, _, P, inputs, targets = build(cfg)
    B, T, H = cfg["batch"], cfg["seq_len"], cfg["n_head"]
    deltas = [torch.zeros(B, H, T, dtype=torch.float64, requires_grad=True) for _ in range(cfg["n_layer"])]
    forward(cfg, P, inputs, targets, deltas)[1].backward()
    rng = SplitMix64(cfg["seed"] ^ 0xFD)
    worst, n_checked = 0.0, 0
    tensors = [(n, P[n], P[n].grad) for n, _, _, _, trainable in specs if trainable]
    tensors += [(f"log f layer {i}", d, d.grad) for i, d in enumerate(deltas)]
    for tname, tensor, grad in tensors:
        if grad is None or float(grad.abs().max()) == 0.0:
            errors = [math.inf]  # a trainable tensor that the loss does not reach is a bug
        else:
            errors = finite_difference_errors(cfg, P, inputs, targets, deltas, tensor, grad, rng, n_entries, h)
        worst = max(worst, max(errors))
        n_checked += len(errors)
        if max(errors) > tol:
            print(f"     {name}: {tname} relative error {max(errors):.2e}")
    checks.check(worst < tol, f"{name}: finite differences, {n_checked} entries of {len(tensors)} tensors, "
                              f"worst relative error {worst:.2e} (< {tol:.0e})")
    # c_0 cancels in every row, so dL/dlog f_0 is 0 up to rounding; at a document start t0 > 0 log f takes no part
    # in c, so its gradient is 0 exactly
    starts = document_starts(inputs, cfg["eot"] if cfg["documents"] else -1) == torch.arange(T)  # (B, T)
    ratio = max(float(d.grad.transpose(1, 2)[:, 0].abs().max() / d.grad.abs().max()) for d in deltas)
    checks.check(ratio < 1e-12, f"{name}: dL/dlog f = 0 at t = 0 (max |d| there / max |d| = {ratio:.1e} < 1e-12)")
    if cfg["documents"]:
        starts[:, 0] = False
        at_starts = max(float(d.grad.transpose(1, 2)[starts].abs().max()) for d in deltas)
        checks.check(at_starts == 0.0 and bool(starts.any()),
                     f"{name}: dL/dlog f = 0 exactly at the {int(starts.sum())} document starts t0 > 0 "
                     f"(max |d| there {at_starts:.1e})")
    frozen = [n for n, _, _, _, trainable in specs if not trainable]
    if frozen:
        checks.check(all(P[n].grad is None for n in frozen), f"{name}: frozen tensors get no gradient")


def logit_change_per_position(cfg, P, inputs, targets, pos):
    # max |logits change| at each position (T,) when the token at pos changes, and max |logits|
    with torch.no_grad():
        base = forward(cfg, P, inputs, targets)[0]
        changed = inputs.copy()
        changed[:, pos] = (changed[:, pos] + 1) % cfg["vocab_size"]
        diff = (forward(cfg, P, changed, targets)[0] - base).abs()
    return diff.amax(dim=(0, 2)), float(base.abs().max())


def check_receptive_field(checks, name, cfg, pos=4):
    # 1 layer, so the receptive field is exact: position i sees tokens (i - w - shift, i], where
    # shift = 1 with a KV-shift (key j mixes in token j - 1). Positions that must not change may
    # still move by rounding: a changed log f_pos moves every later c, and c_i - c_j is rounded
    # differently; allow 1e-12 of max|logits|. The last position that must change must move > 1e-6.
    cfg = dict(cfg, n_layer=1)
    _, _, P, inputs, targets = build(cfg)
    diff, scale = logit_change_per_position(cfg, P, inputs, targets, pos)
    T, w = cfg["seq_len"], cfg["window"]
    last = T - 1 if w == 0 else min(T - 1, pos + w - 1 + int(cfg["k_shift"] or cfg["v_shift"]))
    quiet = torch.cat([diff[:pos], diff[last + 1:]])
    before = float(diff[:pos].max())
    after = float(diff[last + 1:].max()) if last + 1 < T else 0.0
    ok = float(quiet.max()) <= 1e-12 * scale and float(diff[last]) > 1e-6 and float(diff[pos]) > 1e-6
    checks.check(ok, f"{name} (1 layer, window {w}): token {pos} moves positions {pos}..{last} "
                     f"(last by {float(diff[last]):.1e}); before {before:.1e}, after {after:.1e}")


def check_documents_apart(checks, name, cfg):
    # documents=1: each document of the batch gives the logits it gives alone, as a sequence of its own (c
    # restarts, the KV-shift starts from 0, RoPE is relative), to float64 rounding (c's reference differs by log f of
    # its first token, which counts at t = 0 of a sequence and not at a document start); and a changed token of each
    # document moves no logit of any other document, to the bit
    _, _, P, inputs, targets = build(cfg)
    doc = document_starts(inputs, cfg["eot"])
    worst, pieces, moved = 0.0, 0, 0.0
    with torch.no_grad():
        logits = forward(cfg, P, inputs, targets)[0]
        scale = float(logits.abs().max())
        for b in range(cfg["batch"]):
            starts = sorted(set(doc[b].tolist()))
            for s, e in zip(starts, starts[1:] + [cfg["seq_len"]]):
                alone = forward(cfg, P, inputs[b:b + 1, s:e], targets[b:b + 1, s:e])[0][0]
                worst = max(worst, float((alone - logits[b, s:e]).abs().max()) / scale)
                pieces += 1
                changed = inputs.copy()
                changed[b, e - 1] = (changed[b, e - 1] + 1) % cfg["eot"]  # never an EOT
                diff = (forward(cfg, P, changed, targets)[0] - logits).abs()
                diff[b, s:e] = 0
                moved = max(moved, float(diff.max()))
    checks.check(worst < 1e-12 and moved == 0.0, f"{name}: each of {pieces} documents gives its logits alone "
                                                 f"(max err {worst:.1e} < 1e-12); a changed token moves no logit "
                                                 f"outside its document (max {moved:.1e} = 0)")


def check_init_facts(checks):
    # the model document's worked examples (dev/fox.md)
    t = [-1.0 / math.log(1.0 / (1.0 + math.exp(-b))) for b in decay_time_bias(4, 2.0, 128.0)]
    ok = all(abs(a - b) <= 1e-12 * b for a, b in zip(t, [2.0, 8.0, 32.0, 128.0]))
    checks.check(ok, f"decay-time bias, 4 heads (2, 128): T = {', '.join(f'{x:.6f}' for x in t)}")
    sizes = (mlp_hidden_size(768, "llama"), mlp_hidden_size(768, "pro"))
    checks.check(sizes == (2048, 1792), f"MLP hidden size at C = 768: llama {sizes[0]}, pro {sizes[1]}")


def check_training(checks):
    # the fixed gate stays frozen while the rest trains; a written file reads back exactly
    cfg = fixture_config("fox-pro-gate-fixed")
    specs, init, P, inputs, targets = build(cfg)
    train(cfg, specs, P, inputs, targets)
    bias = "model.layers.0.attn.fgate_bias"
    frozen_same = np.array_equal(P[bias].detach().numpy(), init[bias].astype(np.float64))
    q = "model.layers.0.attn.q_proj.weight"
    trained_moved = not np.array_equal(P[q].detach().numpy(), init[q].astype(np.float64))
    checks.check(frozen_same and trained_moved, "fixed gate bias unchanged by training, q_proj changed")
    with tempfile.TemporaryDirectory() as tmp_dir:
        path = os.path.join(tmp_dir, "roundtrip.fxds")
        first, history = run_reference(cfg, path)
        state = read_debug_state(path)
    ok = (state["config"] == config_text(cfg) and np.array_equal(state["inputs"], inputs)
          and np.array_equal(state[q], init[q]) and state["loss"][0] == first["loss"]
          and np.array_equal(state["step_loss"], np.array(history["loss"]))
          and f"grad.{bias}" not in state and f"grad.{q}" in state)
    checks.check(ok, f"file round trip ({len(state)} records)")


def self_test():
    checks = Checks()
    check_init_facts(checks)
    for name, _, _ in FIXTURES:
        check_gradients(checks, name, fixture_config(name))
    for name, _, _ in FIXTURES:
        cfg = fixture_config(name)
        if cfg["documents"]:
            check_documents_apart(checks, name, cfg)
            continue
        check_receptive_field(checks, name, dict(cfg, window=0))
        check_receptive_field(checks, name, dict(cfg, window=8))
    check_training(checks)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return checks.failed == 0


# ----------------------------------------------------------------------------

def write_one(name, cfg, path):
    first, history = run_reference(cfg, path)
    print(f"{name:28s} loss {first['loss']:.6f}  grad_norm {history['grad_norm'][0]:.6f}  "
          f"last_step_loss {history['loss'][-1]:.6f}  clipped {history['clipped']}/{cfg['n_steps']}")


def main():
    parser = argparse.ArgumentParser(description="FoX float64 reference: writes debug-state (.fxds) files.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--all", action="store_true", help="write every fixture into the folder --out")
    mode.add_argument("--preset", help=f"one of {', '.join(PRESETS)}; written to the file --out")
    mode.add_argument("--fixture", help="one fixture, with --set overrides; written to the file --out")
    mode.add_argument("--self-test", action="store_true", help="finite differences, causality, window, init")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override (with --preset or --fixture)")
    parser.add_argument("--out", help="output folder (--all) or file (--preset, --fixture)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one summation order on every machine
    if args.self_test:
        sys.exit(0 if self_test() else 1)
    if not args.out:
        fail("--out is required. HINT: --all --out dev/fixtures, or --preset fox-pro --out x.fxds")
    if args.all:
        if args.set:
            fail("--set does not apply to --all. HINT: use --fixture NAME --set ..., or edit FIXTURES")
        os.makedirs(args.out, exist_ok=True)
        for name, _, _ in FIXTURES:
            write_one(name, fixture_config(name), os.path.join(args.out, f"{name}.fxds"))
        return
    overrides = parse_overrides(args.set)
    if args.fixture:
        write_one(args.fixture, fixture_config(args.fixture, overrides), args.out)
    else:
        write_one(args.preset, resolve_config(args.preset, overrides), args.out)


if __name__ == "__main__":
    main()
