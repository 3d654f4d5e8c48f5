#!/usr/bin/env python3
"""
Checks fox_hf against the independent float64 reference (fox_reference.py), which already names
its parameters as the authors' HuggingFace model does. For every reference fixture that the HF
layout can express (not the sliding-window ones, nor those that keep documents apart: a run's setting, which
the HF model does not carry):

  1. this script writes the fixture's model as an HF folder (its own config.json and
     safetensors writer; F32, BF16 or F16 tensors, depending on the fixture),
  2. fox_hf import turns it into a train_fox checkpoint, and fox_hf logits gives the CPU twin's
     logits on the fixture's batch,
  3. fox_hf export writes the checkpoint back as an HF folder (F32, and BF16 with --bf16),
  4. the reference loads the exported folder by the authors' tensor names and config keys and
     computes the logits in float64: they must match the twin's to 1e-5 (relative to the
     largest logit); the exported tensors must equal the imported ones exactly, and the BF16
     export must be their round-to-nearest-even.

  python3 dev/hf_check.py [--fox-hf ./fox_hf]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fox_reference as ref  # noqa: E402

TOL_LOGITS = 1e-5
# each fixture's tensors are written in this dtype (default F32): import must read all three
FIXTURE_DTYPES = {"fox-llama": "BF16", "transformer-pro": "F16", "fox-pro-qknorm-shared": "BF16"}

# ----------------------------------------------------------------------------
# safetensors, written and read here from the format's description (no safetensors package)


def bf16_round(x):
    # float32 -> bfloat16 bits, round to nearest even (no NaNs here)
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype):
    # tensors: name -> float32 array; stored as dtype (F32, BF16 or F16)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, value in tensors.items():
        if dtype == "F32":
            blob = value.astype("<f4").tobytes()
        elif dtype == "F16":
            blob = value.astype("<f2").tobytes()
        else:
            blob = bf16_round(value).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    # name -> (dtype, float32 array as stored, converted exactly); also checks the tiling
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    data = buf[8 + n:]
    out, spans = {}, []
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "F32":
            value = np.frombuffer(raw, dtype="<f4")
        elif entry["dtype"] == "F16":
            value = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif entry["dtype"] == "BF16":
            value = bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            raise ValueError(f"{path}: unexpected dtype {entry['dtype']} of {name}")
        out[name] = (entry["dtype"], value.reshape(entry["shape"]))
        spans.append((begin, end))
    covered = 0
    for begin, end in sorted(spans):
        assert begin == covered, f"{path}: tensors do not tile the data area"
        covered = end
    assert covered == len(data), f"{path}: the data area has bytes no tensor covers"
    return out


# ----------------------------------------------------------------------------
# config.json in the authors' keys, to and from the reference's configuration


def hf_config(cfg):
    gate_init = cfg["gate"] in ("bias_only", "fixed")
    config = {
        "model_type": "forgetting_transformer-project_fox", "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["n_embd"], "num_hidden_layers": cfg["n_layer"], "num_heads": cfg["n_head"],
        "hidden_ratio": 3.5 if cfg["block"] == "pro" else 4, "intermediate_size": cfg["mlp_hidden"],
        "hidden_act": "swish", "norm_eps": 1e-6, "tie_word_embeddings": False,
        "use_rope": bool(cfg["rope"]), "rope_base": cfg["rope_theta"], "fgate_type": cfg["gate"],
        "fgate_bias_init": gate_init,
        "decay_time_min": cfg["decay_time_min"] if gate_init else None,
        "decay_time_max": cfg["decay_time_max"] if gate_init else None,
        "use_output_gate": bool(cfg["output_gate"]), "ogate_act": "sigmoid",
        "use_output_norm": bool(cfg["output_norm"]), "qk_norm": bool(cfg["qk_norm"]),
        "use_k_shift": bool(cfg["k_shift"]), "use_v_shift": bool(cfg["v_shift"]),
        "log_pruning_tolerance": None,
    }
    if cfg["qk_norm_shared"]:  # absent otherwise: the key's default must be False
        config["qk_norm_share_param_across_head"] = True
    return config


def reference_config(config, batch_cfg):
    # the model keys from an HF config.json, the batch keys from batch_cfg
    cfg = dict(batch_cfg)
    intermediate = config["intermediate_size"]
    cfg.update(
        n_layer=config["num_hidden_layers"], n_embd=config["hidden_size"], n_head=config["num_heads"],
        vocab_size=config["vocab_size"], block="pro" if config["hidden_ratio"] == 3.5 else "llama",
        mlp_hidden=intermediate, gate=config["fgate_type"],
        k_shift=int(config["use_k_shift"]), v_shift=int(config["use_v_shift"]), qk_norm=int(config["qk_norm"]),
        qk_norm_shared=int(config.get("qk_norm_share_param_across_head", False)),
        output_gate=int(config["use_output_gate"]), output_norm=int(config["use_output_norm"]),
        rope=int(config["use_rope"]), rope_theta=float(config["rope_base"]), window=0)
    if config["decay_time_min"] is not None:
        cfg.update(decay_time_min=config["decay_time_min"], decay_time_max=config["decay_time_max"])
    return cfg


MODEL_KEYS = ["n_layer", "n_embd", "n_head", "vocab_size", "mlp_hidden", "block", "gate", "k_shift", "v_shift",
              "qk_norm", "qk_norm_shared", "output_gate", "output_norm", "rope", "rope_theta", "window",
              "decay_time_min", "decay_time_max"]

# ----------------------------------------------------------------------------


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr}")


def logits_of(cfg, tensors, inputs, targets):
    P = {name: torch.tensor(value, dtype=torch.float64) for name, value in tensors.items()}
    with torch.no_grad():
        return ref.forward(cfg, P, inputs, targets)[0].numpy()


def check_fixture(name, fox_hf, tmp, unshare=False):
    cfg = ref.fixture_config(name)
    specs, init, _, inputs, targets = ref.build(cfg)
    dtype = FIXTURE_DTYPES.get(name, "F32")
    tag = name + ("-unshared" if unshare else "")
    src, dst, dst16 = (os.path.join(tmp, f"{tag}-{k}") for k in ("hf-in", "hf-out", "hf-out-bf16"))
    model, tokens, logits_path = (os.path.join(tmp, f"{tag}.{k}") for k in ("bin", "i32", "f32"))
    os.makedirs(src)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    write_safetensors(os.path.join(src, "model.safetensors"), {n: init[n] for n, *_ in specs}, dtype)
    run([fox_hf, "import"] + (["--unshare-qk-norm"] if unshare else []) + [src, model])
    inputs.astype("<i4").tofile(tokens)
    run([fox_hf, "logits", model, str(cfg["seq_len"]), tokens, logits_path])
    run([fox_hf, "export", model, dst])
    run([fox_hf, "export", "--bf16", model, dst16])
    twin = np.fromfile(logits_path, dtype="<f4").reshape(cfg["batch"], cfg["seq_len"], cfg["vocab_size"])

    with open(os.path.join(dst, "config.json")) as f:
        exported_cfg = reference_config(json.load(f), cfg)
    original = read_safetensors(os.path.join(src, "model.safetensors"))
    exported = read_safetensors(os.path.join(dst, "model.safetensors"))
    exported16 = read_safetensors(os.path.join(dst16, "model.safetensors"))
    want_cfg = dict(cfg, qk_norm_shared=0) if unshare else cfg
    problems = [f"config {k}: {exported_cfg[k]} != {want_cfg[k]}" for k in MODEL_KEYS if exported_cfg[k] != want_cfg[k]]
    if set(exported) != set(original):
        problems.append(f"tensor names differ: {sorted(set(exported) ^ set(original))}")
    for n, (_, value) in original.items():
        if n not in exported:
            continue
        got = exported[n][1]
        if unshare and n.endswith(("q_norm.weight", "k_norm.weight")):
            value = np.tile(value, cfg["n_head"])  # each head starts from the shared scale
        if exported[n][0] != "F32" or got.shape != value.shape or not np.array_equal(got, value):
            problems.append(f"{n}: exported F32 tensor differs from the imported one")
        if exported16[n][0] != "BF16" or not np.array_equal(exported16[n][1], bf16_to_f32(bf16_round(got))):
            problems.append(f"{n}: BF16 export is not the round-to-nearest-even of the F32 one")
    ref_logits = logits_of(exported_cfg, {n: v for n, (_, v) in exported.items()}, inputs, targets)
    err = float(np.abs(twin - ref_logits).max() / np.abs(ref_logits).max())
    if not err <= TOL_LOGITS:
        problems.append(f"logits: relative error {err:.2e} > {TOL_LOGITS:.0e}")
    status = "ok  " if not problems else "FAIL"
    print(f"{status} hf {tag:34s} {dtype:4s} import -> twin logits vs reference on the F32 export: "
          f"rel err {err:.1e} (<= {TOL_LOGITS:.0e}); {len(exported)} tensors re-exported exactly, BF16 export rounded")
    for p in problems:
        print(f"     {p}")
    return not problems


def hf_skips(overrides):
    """Fixtures whose logits the HF model cannot give: a sliding window, documents kept apart."""
    return "window" in overrides or overrides.get("documents", 0) == 1


def main():
    parser = argparse.ArgumentParser(description="fox_hf export/import against the float64 reference")
    parser.add_argument("--fox-hf", default="./fox_hf", help="the fox_hf binary (default ./fox_hf)")
    args = parser.parse_args()
    if not os.access(args.fox_hf, os.X_OK):
        ref.fail(f"{args.fox_hf} is not an executable. HINT: make fox_hf")
    torch.set_num_threads(1)
    start = time.time()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(name, False) for name, _, overrides in ref.FIXTURES if not hf_skips(overrides)]
        cases.append(("fox-pro-qknorm-shared", True))
        for name, unshare in cases:
            if check_fixture(name, args.fox_hf, tmp, unshare):
                passed += 1
            else:
                failed += 1
    skipped = [name for name, _, overrides in ref.FIXTURES if hf_skips(overrides)]
    print(f"skipped: {', '.join(skipped)} (the HF layout has no sliding window, test_fox checks that export refuses "
          "it; documents kept apart is a setting of the run, not of the model)")
    print(f"hf-check: {passed} passed, {failed} failed ({time.time() - start:.1f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
