#!/usr/bin/env python3
"""export_mlx.py — write a trained checkpoint as an MLX affine-quantized model directory, and load
such a directory back (dequantized) as a float PyTorch model.

Quantization (the rule of ../shared/DESIGN.md "Model format", the same as src/model/mkmodel.c
ib_mlx_quantize with round_bf16): per group of `group` consecutive weights along the input dimension,
in float32: scale = max((max-min)/(2^bits-1), 1e-7); edge = min if |min| > |max| (scale positive)
else max (scale negated); q0 = round(edge/scale); if q0 != 0: scale = edge/q0, bias = edge, else
bias = 0; scale and bias are rounded to bfloat16 (round to nearest even), then
q = clip(round((w - bias)/scale), 0, 2^bits-1) (round half to even, NaN -> 0), packed into uint32
words low bits first (element j of each 32/bits in bits j*bits..). Dequantized w = scale*q + bias.
Quantized: the embedding (also the tied lm_head) and every projection; norms stay bfloat16.

Usage:
  python3 train/export_mlx.py --ckpt train/out/ckpt --tokenizer train/out/tokenizer --out models/default
"""
import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
from model import Qwen3  # noqa: E402

QUANTIZED_SUFFIXES = ("embed_tokens.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                      "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def quantize(w, bits=4, group=64):
    """w [N][K] float -> (wq int64 [N][K*bits/32] of uint32 values, scales bf16 [N][K/group], biases bf16)."""
    w = w.detach().to(torch.float32).cpu()
    N, K = w.shape
    assert K % group == 0 and group % 32 == 0
    nb = float((1 << bits) - 1)
    x = w.view(N, K // group, group)                                  # [N][G][group]
    mx = x.max(dim=-1).values
    mn = x.min(dim=-1).values
    scale = (mx - mn) / torch.tensor(nb, dtype=torch.float32)
    scale = torch.where(scale > 1e-7, scale, torch.full_like(scale, 1e-7))
    neg_edge = mn.abs() > mx.abs()
    edge = torch.where(neg_edge, mn, mx)
    scale = torch.where(neg_edge, scale, -scale)
    q0 = torch.round(edge / scale)
    nz = q0 != 0
    scale = torch.where(nz, edge / torch.where(nz, q0, torch.ones_like(q0)), scale)
    bias = torch.where(nz, edge, torch.zeros_like(edge))
    scale_h = scale.to(torch.bfloat16)
    bias_h = bias.to(torch.bfloat16)
    s, b = scale_h.float()[..., None], bias_h.float()[..., None]
    q = torch.round((x - b) / s)
    q = torch.nan_to_num(q, nan=0.0).clamp(0, nb).to(torch.int64).view(N, K)
    per = 32 // bits
    q = q.view(N, K // per, per)
    shifts = (torch.arange(per, dtype=torch.int64) * bits)
    wq = (q << shifts).sum(dim=-1)                                   # [N][K/per], < 2^32
    return wq, scale_h, bias_h


def dequantize(wq, scales, biases, bits=4, group=64):
    """Inverse layout of quantize: float32 [N][K] = scale*q + bias (in float32)."""
    N = wq.shape[0]
    per = 32 // bits
    shifts = (torch.arange(per, dtype=torch.int64) * bits)
    q = ((wq.to(torch.int64)[..., None] >> shifts) & ((1 << bits) - 1)).view(N, -1).float()   # [N][K]
    K = q.shape[1]
    s = scales.float().repeat_interleave(group, dim=1)
    b = biases.float().repeat_interleave(group, dim=1)
    assert s.shape[1] == K
    return q * s + b


def hf_config(mcfg, bits, group, eos_id):
    c = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "head_dim": mcfg["head_dim"],
        "hidden_act": "silu",
        "hidden_size": mcfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": mcfg["intermediate_size"],
        "max_position_embeddings": mcfg["max_position_embeddings"],
        "max_window_layers": mcfg["num_hidden_layers"],
        "model_type": "qwen3",
        "num_attention_heads": mcfg["num_attention_heads"],
        "num_hidden_layers": mcfg["num_hidden_layers"],
        "num_key_value_heads": mcfg["num_key_value_heads"],
        "quantization": {"group_size": group, "bits": bits},
        "quantization_config": {"group_size": group, "bits": bits},
        "rms_norm_eps": mcfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": mcfg["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": mcfg["vocab_size"],
    }
    return c


def load_ckpt(ckdir):
    """(state dict of float32 tensors, meta dict) from ckpt shards written by train.py."""
    meta = json.load(open(os.path.join(ckdir, "meta.json")))
    sd = {}
    for shard in meta["shards"]:
        t, _ = st.load(os.path.join(ckdir, shard))
        sd.update({k: v.float() for k, v in t.items()})
    return sd, meta


def export(sd, mcfg, tokdir, out, bits=4, group=64):
    """Write out/{model.safetensors, config.json, tokenizer.json, tokenizer_config.json}."""
    os.makedirs(out, exist_ok=True)
    tensors, u32 = {}, set()
    for name, w in sd.items():
        if name.endswith(QUANTIZED_SUFFIXES):
            base = name[: -len(".weight")]
            wq, s, b = quantize(w, bits, group)
            tensors[base + ".weight"] = wq
            tensors[base + ".scales"] = s
            tensors[base + ".biases"] = b
            u32.add(base + ".weight")
        else:
            tensors[name] = w.to(torch.bfloat16)
    st.save(os.path.join(out, "model.safetensors"), tensors, metadata={"format": "mlx"}, u32=u32)
    tc = json.load(open(os.path.join(tokdir, "tokenizer_config.json")))
    tj = json.load(open(os.path.join(tokdir, "tokenizer.json")))
    eos = [t["id"] for t in tj["added_tokens"] if t["content"] == tc["eos_token"]][0]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(mcfg, bits, group, eos), f, indent=4)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(os.path.join(tokdir, fn)) != os.path.abspath(os.path.join(out, fn)):
            shutil.copyfile(os.path.join(tokdir, fn), os.path.join(out, fn))


def load_mlx_dir(path, dtype=torch.float32):
    """A Qwen3 module whose weights are the directory's weights dequantized (exactly, in float32)."""
    cfg = json.load(open(os.path.join(path, "config.json")))
    q = cfg.get("quantization") or {}
    bits, group = q.get("bits"), q.get("group_size")
    t, _ = st.load(os.path.join(path, "model.safetensors"))
    sd = {}
    for name, v in t.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")]
        if base + ".scales" in t:
            sd[name] = dequantize(v, t[base + ".scales"], t[base + ".biases"], bits, group)
        else:
            sd[name] = v.float()
    mcfg = {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta",
                                "max_position_embeddings")}
    m = Qwen3(mcfg)
    missing, unexpected = m.load_state_dict(sd, strict=True), None
    return m.to(dtype).eval(), cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    a = ap.parse_args()
    sd, meta = load_ckpt(a.ckpt)
    export(sd, meta["model"], a.tokenizer, a.out, a.bits, a.group)
    print("export: %s (%d bytes model.safetensors)" % (a.out, os.path.getsize(os.path.join(a.out, "model.safetensors"))))


if __name__ == "__main__":
    main()
