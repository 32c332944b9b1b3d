#!/usr/bin/env python3
"""isobatch's Gemma 4 logits against Hugging Face transformers' Gemma4ForCausalLM run in float64.

For each case it writes a model with random weights (`isobatch mkmodel`), runs a few prompts of token ids
through isobatch (`isobatch accuracy --act f32 --logits-out`: the engine's float32 logits after every
token, one step a token) and through transformers' Gemma4ForCausalLM (weights read from the same
model.safetensors and dequantized exactly as isobatch stores them, the model in float64), and compares
every position's logits: relative L2 over all logits of a prompt (||engine - HF|| / ||HF||, the measure
of `isobatch accuracy` and tests/gemma4_ref.py), relative L2 per position (its max is shown too), top-1
agreement. A case passes when every prompt's relative L2 is <= 1e-5 and every top-1 agrees. (The
per-position maximum is not the criterion: against an exact float64 reference, single positions of the
tiny dense model reach 1.2e-5 in float32 while the whole prompt stays near 3e-6.)

transformers keeps three things in float32 even in a float64 model: the RoPE cos/sin tables (float32
angles: at position 1000 an angle carries an error of about 6e-5), every RMSNorm, and the attention
softmax. By default (--hf-mode both) HF runs twice: "float64", with those three evaluated in float64
(the same formulas: the patched functions are checked against transformers' own output on every call
kind before they are used, and the RoPE frequencies against transformers' own buffers), which gives
the verdict; and "stock", as transformers ships it, printed for information.

Also (--refs auto): the project's float64 references on the same weights, compared with HF and with
isobatch, for information: tests/gemma4_ref.py (numpy) on the small cases, `isobatch accuracy`'s C
reference on the small cases and on the real shapes' first prompt (23 tokens). They tell an HF setup error (HF
far from both) apart from isobatch's own float32 error (isobatch as far from them as from HF).

usage (from the repository root, on a machine with torch + transformers; see docs/gemma4.md):
  python3 bench/gemma4_hf_check.py --isobatch build/isobatch --work OUT/work [--cases dense,moe,real]
      [--real-layers 6] [--device auto|cuda|cpu] [--hf-mode both|float64|stock] [--refs auto|yes|no]
      [--perturb] [--threads N] [--keep] [--json OUT/summary.json]
Exit 0: every case passed; 1: some case failed; 2: setup error (missing module, mismatched tensors).
--perturb multiplies one HF weight (model.norm.weight[0]) by 1.01 before HF runs: every case must FAIL.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

TOL_REL_L2 = 1e-5

# name: (preset, bits, seed, extra mkmodel flags, what it is)
CASES = {
    "dense": ("gemma4-tiny", 4, 11, [], "tiny dense, MLX 4-bit"),
    "dense32": ("gemma4-tiny", 32, 12, [], "tiny dense, float32 weights"),
    "moe": ("gemma4-moe-tiny", 4, 13, [], "tiny MoE (8 experts, top-2), MLX 4-bit"),
    "moe3": ("gemma4-moe-tiny", 8, 14, ["--top-k", "3"], "tiny MoE, top-3 (combine order matters), MLX 8-bit"),
    "kvshared": ("gemma4-tiny", 4, 16, ["--kv-shared", "2"],
                 "tiny dense, KV sharing (num_kv_shared_layers 2: layers 2, 3 read layers 0, 1), MLX 4-bit"),
    "ple": ("gemma4-tiny", 4, 17, ["--ple", "64", "--kv-shared", "2"],
            "tiny dense, per-layer embeddings (hidden_size_per_layer_input 64) and KV sharing, MLX 4-bit"),
    "doublewide": ("gemma4-tiny", 4, 18, ["--kv-shared", "2", "--double-wide"],
                   "tiny dense, KV sharing with use_double_wide_mlp (layers 2, 3: MLPs of 2 x F), MLX 4-bit"),
    "real": ("gemma4-26b-a4b", 8, 15, None, "Gemma-4-26B-A4B's real shapes on its first layers, MLX 8-bit"),
}
DEFAULT_CASES = "dense,dense32,moe,moe3,kvshared,ple,doublewide,real"


class SetupError(Exception):
    """Something that makes the comparison impossible (not a numeric failure)."""


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- safetensors, as isobatch reads them

def st_open(path):
    """Header and a read-only byte map of a .safetensors file: (header dict, uint8 memmap of the data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return header, data


_DT = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "U32": "<u4", "I32": "<i4", "U8": "u1", "I8": "i1"}


def st_array(header, data, name):
    """Tensor `name` as a numpy array of its stored type (BF16 widened exactly to float32)."""
    e = header[name]
    a, b = e["data_offsets"]
    raw = data[a:b]
    if e["dtype"] == "BF16":
        arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif e["dtype"] in _DT:
        arr = np.frombuffer(raw, dtype=_DT[e["dtype"]])
    else:
        raise SetupError("tensor %s: dtype %s not handled" % (name, e["dtype"]))
    return arr.reshape(e["shape"])


def quant_params(cfg, module):
    """(bits, group) of an MLX-quantized module: config.json's "quantization" (per-module overrides
    as mlx-lm writes them, else the global bits / group_size)."""
    q = cfg.get("quantization") or cfg.get("quantization_config") or {}
    own = q.get(module)
    if isinstance(own, dict):
        return int(own["bits"]), int(own["group_size"])
    if "bits" not in q or "group_size" not in q:
        raise SetupError("%s is quantized but config.json has no quantization bits / group_size" % module)
    return int(q["bits"]), int(q["group_size"])


def dequantize(wq, scales, biases, bits, group, name):
    """MLX affine dequantization in float64, exactly: w[.., n, k] = scales[.., n, k // group] *
    q[.., n, k] + biases[.., n, k // group], q packed low bits first in uint32 words.
    wq [..., N, K*bits/32] uint32; scales, biases [..., N, K/group] -> [..., N, K] float64."""
    if 32 % bits:
        raise SetupError("%s: %d-bit packing (words not whole) not handled" % (name, bits))
    per = 32 // bits
    K = wq.shape[-1] * per
    if scales.shape != biases.shape or scales.shape[:-1] != wq.shape[:-1] or scales.shape[-1] * group != K:
        raise SetupError("%s: packed %s, scales %s, biases %s disagree with bits %d, group %d" %
                         (name, wq.shape, scales.shape, biases.shape, bits, group))
    lead = wq.shape[:-1]
    rows = int(np.prod(lead))
    wq2 = wq.reshape(rows, wq.shape[-1])
    s2 = scales.reshape(rows, -1).astype(np.float64)
    b2 = biases.reshape(rows, -1).astype(np.float64)
    out = np.empty((rows, K), dtype=np.float64)
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
    mask = np.uint32((1 << bits) - 1)
    step = max(1, (1 << 22) // max(K, 1))       # rows per block: about 4M elements at a time
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        q = (np.asarray(wq2[r0:r1])[:, :, None] >> shifts) & mask            # [r, K/per, per]
        q = q.reshape(r1 - r0, K // group, group).astype(np.float64)
        w = q * s2[r0:r1, :, None] + b2[r0:r1, :, None]
        out[r0:r1] = w.reshape(r1 - r0, K)
    return out.reshape(*lead, K)


def load_weights(model_dir, cfg):
    """Every tensor of model_dir/model.safetensors as float64 numpy arrays, named as isobatch names them
    with the prefix "model." (a gemma4 wrapper's "model.language_model." is renamed); MLX-quantized
    linears (.weight U32 + .scales + .biases) dequantized. Returns (dict name -> array, notes)."""
    header, data = st_open(os.path.join(model_dir, "model.safetensors"))
    names = [n for n in header if n != "__metadata__"]
    out, notes = {}, []
    for n in sorted(names):
        if n.endswith(".scales") or n.endswith(".biases"):
            base = n[: -len(".scales")]
            if base + ".weight" in header:
                continue          # read with its weight
        if any(n.startswith(p) for p in ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                                          "model.embed_audio.")):
            continue
        arr = st_array(header, data, n)
        if n.endswith(".weight") and header[n]["dtype"] == "U32":
            base = n[: -len(".weight")]
            if base + ".scales" not in header or base + ".biases" not in header:
                raise SetupError("%s is U32 without %s.scales / .biases" % (n, base))
            bits, group = quant_params(cfg, base)
            arr = dequantize(arr, st_array(header, data, base + ".scales"), st_array(header, data, base + ".biases"),
                             bits, group, n)
            notes.append((n, bits, group))
        else:
            arr = np.asarray(arr, dtype=np.float64)
        key = n.replace("model.language_model.", "model.", 1)
        out[key] = arr
    return out, notes


def text_config(cfg):
    """The text model's config.json fields (gemma4: its text_config)."""
    if cfg.get("model_type") == "gemma4":
        t = dict(cfg["text_config"])
        for k in ("quantization", "quantization_config"):
            if k in cfg and k not in t:
                t[k] = cfg[k]
        return t
    return cfg


# ---------------------------------------------------------------- isobatch

ISOBATCH_ENV = None   # the environment of the isobatch processes (--isobatch-libs), None: this one's


def run(cmd, what):
    """Run cmd (an isobatch command); its stdout; a SetupError with its last lines on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ISOBATCH_ENV)
    if p.returncode != 0:
        raise SetupError("%s failed (exit %d): %s\n  command: %s" %
                         (what, p.returncode, (p.stderr or p.stdout).strip()[-2000:], " ".join(cmd)))
    return p.stdout


def isobatch_logits(binary, model_dir, ids, V, path, ref_path, threads):
    """isobatch's float32 logits after every token of ids ([T][V] float64 array), one step a token
    (`accuracy --act f32 --logits-out`); with ref_path also the C float64 reference's ([T][V] or None)."""
    cmd = [binary, "accuracy", "-m", model_dir, "--prompt-ids", ",".join(map(str, ids)), "--tokens", str(len(ids)),
           "--act", "f32", "--logits-out", path, "--json"]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += ["--ref-logits-out", ref_path] if ref_path else ["--no-reference"]
    t0 = time.time()
    out = run(cmd, "isobatch accuracy")
    eng = np.fromfile(path, dtype="<f4")
    if eng.size != len(ids) * V:
        raise SetupError("%s: %d floats, expected %d x %d" % (path, eng.size, len(ids), V))
    ref = None
    if ref_path:
        ref = np.fromfile(ref_path, dtype="<f8").reshape(len(ids), V)
    return eng.reshape(len(ids), V).astype(np.float64), ref, out.strip(), time.time() - t0


# ---------------------------------------------------------------- metrics

def compare(got, ref):
    """got, ref [T][V]: per-position relative L2 (||got_t - ref_t|| / ||ref_t||), its max and where,
    the relative L2 over all logits, top-1 agreement (argmax, ties to the lowest id)."""
    d = np.linalg.norm(got - ref, axis=1)
    r = np.linalg.norm(ref, axis=1)
    per = d / np.where(r > 0, r, 1.0)
    top_g, top_r = np.argmax(got, axis=1), np.argmax(ref, axis=1)
    return {
        "positions": int(got.shape[0]),
        "max_rel_l2": float(per.max()),
        "argmax_pos": int(per.argmax()),
        "rel_l2_all": float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300)),
        "top1": int(np.sum(top_g == top_r)),
        "top1_first_miss": int(np.nonzero(top_g != top_r)[0][0]) if np.any(top_g != top_r) else -1,
        "over_tol": int(np.sum(per > TOL_REL_L2)),
        "first_over_tol": int(np.nonzero(per > TOL_REL_L2)[0][0]) if np.any(per > TOL_REL_L2) else -1,
        "quartiles": [float(q) for q in np.percentile(per, [25, 50, 75])],
        "worst": [[int(i), float(per[i])] for i in np.argsort(-per)[:5]],
    }


def merge(ms):
    """Several prompts' compare() results as one."""
    if not ms:
        return None
    return {"positions": sum(m["positions"] for m in ms), "max_rel_l2": max(m["max_rel_l2"] for m in ms),
            "rel_l2_all_max": max(m["rel_l2_all"] for m in ms), "top1": sum(m["top1"] for m in ms)}


def fmt(m):
    s = "rel L2 %.3g (largest at one position %.3g, position %d), top-1 %d/%d" % (
        m["rel_l2_all"], m["max_rel_l2"], m["argmax_pos"], m["top1"], m["positions"])
    if m["top1_first_miss"] >= 0:
        s += " (first miss at position %d)" % m["top1_first_miss"]
    if m["over_tol"]:   # where a failing prompt goes wrong: how many positions, from where, how spread
        s += "; %d positions over %g, the first %d; per-position quartiles %s; worst %s" % (
            m["over_tol"], TOL_REL_L2, m["first_over_tol"], "/".join("%.2g" % q for q in m["quartiles"]),
            ", ".join("%d: %.2g" % (i, e) for i, e in m["worst"]))
    return s


def passes(m):
    """A prompt's comparison passes: relative L2 over all its logits <= TOL_REL_L2, every top-1 agrees."""
    return m["rel_l2_all"] <= TOL_REL_L2 and m["top1"] == m["positions"]


# ---------------------------------------------------------------- transformers

def exact_inv_freq(tc, layer_type):
    """RoPE inverse frequencies of a layer type in float64, from config.json (docs/gemma4.md): sliding
    layers theta^(-2i/head_dim) for every pair; full layers with "proportional" RoPE the first
    floor(partial_rotary_factor * global_head_dim / 2) pairs theta^(-2i/global_head_dim), the others 0."""
    rp = tc["rope_parameters"][layer_type]
    theta = float(rp["rope_theta"])
    hd = tc["head_dim"]
    if layer_type == "full_attention":
        hd = tc.get("global_head_dim") or hd
        for v in (tc.get("per_layer_config") or {}).values():
            hd = v.get("head_dim", hd)
    half = hd // 2
    i = np.arange(half, dtype=np.float64)
    inv = theta ** (-(2.0 * i) / hd)
    if rp.get("rope_type", "default") == "proportional":
        n_rot = int(rp.get("partial_rotary_factor", 1.0) * hd // 2)
        inv = np.where(np.arange(half) < n_rot, inv, 0.0)
    return inv


class Float64Internals:
    """While active: transformers' Gemma 4 RMSNorm, RoPE tables, eager attention softmax and MoE router
    evaluated in the model's dtype (float64) with the same formulas. Every replacement is checked against
    transformers' own function on its first call of each kind (relative difference small, same shapes),
    and the RoPE frequencies against transformers' own float32 buffers; a mismatch raises. Also records,
    for every position, the smallest relative gap between the k-th and (k+1)-th router logits over the
    layers (`margins`): a routed choice that close to a tie can differ between two exact-enough
    implementations, and one differing choice changes that position's whole MoE output."""

    def __init__(self, mod, tc, torch):
        self.mod, self.tc, self.torch = mod, tc, torch
        self.calls = {"rmsnorm": 0, "rope": 0, "attention": 0, "router": 0}
        self.checked = set()
        self.saved = []
        self.margins = None   # [T] smallest relative k-th / (k+1)-th router logit gap over the layers so far

    def _check(self, kind, mine, theirs_fn, tol):
        """On the first call of this kind: mine against theirs_fn() (transformers' own), relative to its
        largest magnitude; raise when further apart than tol."""
        if kind in self.checked:
            return
        torch = self.torch
        theirs = theirs_fn()
        if tuple(mine.shape) != tuple(theirs.shape):
            raise SetupError("float64 %s: shape %s, transformers' %s" % (kind, tuple(mine.shape), tuple(theirs.shape)))
        scale = float(torch.max(torch.abs(theirs)).item()) or 1.0
        diff = float(torch.max(torch.abs(mine - theirs.to(mine.dtype))).item()) / scale
        if not diff <= tol:
            raise SetupError("float64 %s differs from transformers' own by %.3g (relative to its max): the "
                             "replacement does not match this transformers version; run with --hf-mode stock" %
                             (kind, diff))
        self.checked.add(kind)

    def __enter__(self):
        mod, torch, me = self.mod, self.torch, self
        for cls_name in ("Gemma4RMSNorm", "Gemma4TextRotaryEmbedding"):
            if not hasattr(mod, cls_name):
                raise SetupError("transformers' modeling_gemma4 has no %s: run with --hf-mode stock" % cls_name)
        if not hasattr(mod, "eager_attention_forward"):
            raise SetupError("transformers' modeling_gemma4 has no eager_attention_forward: run with --hf-mode stock")
        norm_orig = mod.Gemma4RMSNorm.forward
        rope_orig = mod.Gemma4TextRotaryEmbedding.forward
        attn_orig = mod.eager_attention_forward
        inv64 = {}

        def norm64(self, x):
            eps = getattr(self, "eps", None)
            if eps is None:
                raise SetupError("transformers' Gemma4RMSNorm has no eps attribute: run with --hf-mode stock")
            y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
            w = getattr(self, "weight", None)
            if getattr(self, "with_scale", w is not None) and w is not None:
                y = y * w
            me._check("rmsnorm (%s)" % ("weight" if w is not None else "no weight"), y, lambda: norm_orig(self, x),
                      1e-4)
            me.calls["rmsnorm"] += 1
            return y

        def rope64(self, x, position_ids, layer_type=None):
            if layer_type not in ("sliding_attention", "full_attention"):
                raise SetupError("transformers' Gemma 4 rotary embedding called with layer_type %r (expected "
                                 "sliding_attention / full_attention): run with --hf-mode stock" % (layer_type,))
            cos_t, sin_t = rope_orig(self, x, position_ids, layer_type)
            if layer_type not in inv64:
                buf = getattr(self, "%s_inv_freq" % layer_type, None)
                if buf is None:
                    buf = getattr(self, "inv_freq", None)
                if buf is None:
                    raise SetupError("transformers' rotary embedding has no %s_inv_freq buffer: run with "
                                     "--hf-mode stock" % layer_type)
                theirs = buf.detach().double().cpu().numpy().reshape(-1)
                mine = exact_inv_freq(me.tc, layer_type)
                if theirs.shape != mine.shape or np.any((theirs == 0) != (mine == 0)) or \
                        not np.allclose(theirs, mine, rtol=1e-6, atol=0):
                    raise SetupError("RoPE frequencies of %s: transformers' %s..., config.json's %s...: run with "
                                     "--hf-mode stock" % (layer_type, theirs[:6], mine[:6]))
                inv64[layer_type] = torch.tensor(mine, dtype=torch.float64, device=x.device)
            scaling = float(getattr(self, "%s_attention_scaling" % layer_type, 1.0) or 1.0)
            f = position_ids.to(torch.float64)[..., None] * inv64[layer_type]       # [B, T, hd/2]
            emb = torch.cat((f, f), dim=-1)                                         # [B, T, hd]
            cos, sin = (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)
            # float32 angles are off by up to ~1e-4 at position 1000: the check is for the layout
            me._check("rope cos (%s)" % layer_type, cos, lambda: cos_t, 1e-2)
            me._check("rope sin (%s)" % layer_type, sin, lambda: sin_t, 1e-2)
            me.calls["rope"] += 1
            return cos, sin

        def attn64(module, query, key, value, attention_mask, *args, **kwargs):
            # query [B, H, T, hd]; key, value [B, KVH, S, hd]; mask additive [B, 1, T, S] or boolean
            scaling = kwargs.get("scaling")
            if scaling is None:
                scaling = module.head_dim ** -0.5
            softcap = kwargs.get("softcap")
            g = query.shape[1] // key.shape[1]
            k = key.repeat_interleave(g, dim=1)
            v = value.repeat_interleave(g, dim=1)
            s = torch.matmul(query, k.transpose(2, 3)) * scaling                    # [B, H, T, S]
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            if attention_mask is not None:
                m = attention_mask[:, :, :, : k.shape[-2]]
                s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(s.dtype)
            p = torch.softmax(s, dim=-1)                                            # in float64
            o = torch.matmul(p, v).transpose(1, 2).contiguous()                     # [B, T, H, hd]
            me._check("attention", o, lambda: attn_orig(module, query, key, value, attention_mask, *args, **kwargs)[0],
                      1e-4)
            me.calls["attention"] += 1
            return o, p

        self.saved = [(mod.Gemma4RMSNorm, "forward", norm_orig), (mod.Gemma4TextRotaryEmbedding, "forward", rope_orig),
                      (mod, "eager_attention_forward", attn_orig)]
        mod.Gemma4RMSNorm.forward = norm64
        mod.Gemma4TextRotaryEmbedding.forward = rope64
        mod.eager_attention_forward = attn64
        router_cls = getattr(mod, "Gemma4TextRouter", None)
        if router_cls is not None:      # absent in transformers without the MoE block: nothing to replace
            router_orig = router_cls.forward

            def router64(self, hidden_states):
                # hidden_states [N, D] -> (probabilities [N, E], top-k weights [N, k], top-k ids [N, k]), as
                # transformers' router computes them, every step in float64 (its own is not that exact: the MoE
                # cases sit 6-8e-8 from both float64 references where the dense ones are 1e-15)
                k = getattr(getattr(self, "config", None), "top_k_experts", None)
                needed = ("norm", "scale", "scalar_root_size", "proj", "per_expert_scale")
                if k is None or not all(hasattr(self, a) for a in needed):
                    raise SetupError("transformers' Gemma4TextRouter has not the attributes %s and config.top_k_experts: "
                                     "run with --hf-mode stock" % (needed,))
                x = self.norm(hidden_states)                                   # norm64 (weightless)
                x = x * self.scale.to(x.dtype) * self.scalar_root_size
                logits = torch.nn.functional.linear(x, self.proj.weight.to(x.dtype))  # [N, E]
                probs = torch.softmax(logits, dim=-1)
                # ties to the lowest id, as the definition has them (a float64 tie is not expected here)
                order = torch.sort(logits, dim=-1, descending=True, stable=True)
                idx = order.indices[:, :k]
                w = torch.gather(probs, -1, idx)
                w = w / w.sum(dim=-1, keepdim=True) * self.per_expert_scale.to(x.dtype)[idx]
                top = order.values
                gap = ((top[:, k - 1] - top[:, k]) / top[:, k - 1].abs().clamp_min(1e-300)).detach().cpu().numpy()
                me.margins = gap if me.margins is None or me.margins.shape != gap.shape else np.minimum(me.margins, gap)
                if "router" not in me.checked:
                    theirs = router_orig(self, hidden_states)
                    same = (torch.sort(theirs[2], dim=-1).values == torch.sort(idx, dim=-1).values).all(dim=-1)
                    if float(same.double().mean().item()) < 0.9:
                        raise SetupError("float64 router: its top-%d ids differ from transformers' own on %d of %d "
                                         "rows: run with --hf-mode stock" % (k, int((~same).sum().item()), same.numel()))
                    me._check("router probabilities", probs, lambda: theirs[0], 1e-4)
                me.calls["router"] += 1
                return probs, w, idx

            self.saved.append((router_cls, "forward", router_orig))
            router_cls.forward = router64
        return self

    def __exit__(self, *exc):
        for obj, name, orig in self.saved:
            setattr(obj, name, orig)
        return False


def hf_name(n):
    """transformers' Gemma4ForCausalLM parameter name of an isobatch tensor name (None: part of a
    gate_up_proj pair, handled by the caller)."""
    if ".experts.switch_glu.down_proj.weight" in n:
        return n.replace(".experts.switch_glu.down_proj.weight", ".experts.down_proj")
    if ".experts.switch_glu." in n:
        return None
    return n


class HF:
    """transformers' Gemma4ForCausalLM in float64 with the weights of one isobatch model."""

    def __init__(self, cfg, W, device, perturb):
        try:
            import torch
            import transformers
            from transformers import Gemma4ForCausalLM, Gemma4TextConfig
            from transformers.models.gemma4 import modeling_gemma4
        except Exception as e:   # noqa: BLE001 (any import failure is a setup error)
            raise SetupError("transformers' Gemma 4 is not importable here: %s" % e)
        self.torch, self.mod = torch, modeling_gemma4
        self.noted = set()
        tc = text_config(cfg)
        self.tc = tc
        d = {k: v for k, v in tc.items() if k not in ("quantization", "quantization_config", "torch_dtype", "dtype")}
        hfc = Gemma4TextConfig.from_dict(d)
        for attr, val in (("_attn_implementation", "eager"), ("_experts_implementation", "eager")):
            try:
                setattr(hfc, attr, val)
            except Exception as e:   # noqa: BLE001
                log("note: could not set config.%s = %r: %s" % (attr, val, e))
        # fields whose transformers default would add structure isobatch's model does not have
        for k in ("hidden_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp"):
            got, want = getattr(hfc, k, 0) or 0, tc.get(k) or 0
            if got != want:
                raise SetupError("HF config %s = %r (config.json %r): the model would not be the one isobatch "
                                 "runs" % (k, got, tc.get(k)))
        if list(hfc.layer_types) != list(tc["layer_types"]):
            raise SetupError("HF layer_types %s, config.json %s" % (hfc.layer_types, tc["layer_types"]))
        log("transformers %s, torch %s, device %s" % (transformers.__version__, torch.__version__, device))
        log("HF config used: %s" % json.dumps(hfc.to_dict(), sort_keys=True, default=str))
        torch.manual_seed(0)
        t0 = time.time()
        with torch.device(device):
            model = Gemma4ForCausalLM(hfc)
        model = model.to(torch.float64).eval()
        for setter in ("set_attn_implementation", "set_experts_implementation"):
            f = getattr(model, setter, None)
            if f is not None:
                try:
                    f("eager")
                except Exception as e:   # noqa: BLE001
                    log("note: model.%s('eager'): %s" % (setter, e))
        log("HF attention implementation %r, experts implementation %r" %
            (getattr(model.config, "_attn_implementation", "?"), getattr(model.config, "_experts_implementation", "?")))
        self.model = model
        self._load(W)
        if perturb:
            with torch.no_grad():
                w = model.model.norm.weight
                w[0] = w[0] * 1.01
            log("--perturb: HF's model.norm.weight[0] multiplied by 1.01 (this run must FAIL)")
        log("HF model built and loaded in %.1f s" % (time.time() - t0))

    def _load(self, W):
        torch, model = self.torch, self.model
        targets = dict(model.named_parameters())
        targets.update(dict(model.named_buffers()))
        expected = set(model.state_dict().keys())
        done, unmatched_ours = set(), []
        for n in sorted(W):
            hn = hf_name(n)
            if hn is None:
                if n.endswith(".gate_proj.weight"):   # gate then up rows: transformers' gate_up_proj
                    base = n[: -len("switch_glu.gate_proj.weight")]
                    up = base + "switch_glu.up_proj.weight"
                    if up not in W:
                        raise SetupError("%s without %s" % (n, up))
                    arr = np.concatenate([W[n], W[up]], axis=1)      # [E, 2 Fm, D]
                    hn = base + "gate_up_proj"
                elif n.endswith(".up_proj.weight"):
                    continue
                else:
                    unmatched_ours.append(n)
                    continue
            else:
                arr = W[n]
            t = targets.get(hn)
            if t is None:
                unmatched_ours.append(n)
                continue
            if tuple(t.shape) != tuple(arr.shape):
                if arr.size == t.numel() and arr.ndim <= 1 and t.dim() <= 1:   # e.g. layer_scalar [1] vs []
                    arr = arr.reshape(tuple(t.shape))
                else:
                    raise SetupError("%s -> %s: shape %s, transformers expects %s" % (n, hn, arr.shape, tuple(t.shape)))
            with torch.no_grad():
                t.copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(t.device, torch.float64))
            done.add(hn)
        missing = sorted(expected - done)
        if "lm_head.weight" in missing:
            lm, emb = model.lm_head.weight, model.model.embed_tokens.weight
            if lm.data_ptr() == emb.data_ptr():
                missing.remove("lm_head.weight")            # tied: the same tensor
            elif self.tc.get("tie_word_embeddings", True):
                with torch.no_grad():
                    lm.copy_(emb)
                missing.remove("lm_head.weight")
                log("note: lm_head.weight not tied in the HF model: copied from embed_tokens (tie_word_embeddings)")
        if missing or unmatched_ours:
            log("isobatch tensors with no HF counterpart (%d):" % len(unmatched_ours))
            for n in unmatched_ours:
                log("  " + n)
            log("HF parameters/buffers not loaded (%d):" % len(missing))
            for n in missing:
                log("  " + n)
            raise SetupError("tensor names do not match (lists above)")
        log("HF: %d tensors loaded (float64)" % len(done))

    def logits(self, ids, float64_internals):
        """[T][V] float64 logits of every position of ids."""
        torch = self.torch
        dev = next(self.model.parameters()).device
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        patch = Float64Internals(self.mod, self.tc, torch) if float64_internals else None
        self.margins = None
        with torch.no_grad():
            if patch:
                with patch:
                    out = self.model(input_ids=x, use_cache=False)
                self.margins = patch.margins
                if self.tc.get("enable_moe_block") and not patch.calls["router"] and "router" not in self.noted:
                    self.noted.add("router")
                    log("note: the float64 router was not used (this transformers has no Gemma4TextRouter.forward "
                        "to replace): HF's own router ran")
                if not patch.calls["rope"]:
                    raise SetupError("the float64 RoPE tables were not used (calls %s): this transformers version "
                                     "computes them elsewhere; run with --hf-mode stock" % patch.calls)
                for k in ("rmsnorm", "attention"):
                    if not patch.calls[k] and k not in self.noted:
                        self.noted.add(k)
                        log("note: the float64 %s was not used (this transformers calls another function): HF's "
                            "own %s ran (float32 inside, about 1e-7 relative)" % (k, k))
            else:
                out = self.model(input_ids=x, use_cache=False)
        lg = out.logits[0]
        if lg.dtype != torch.float64:
            raise SetupError("HF logits are %s, not float64" % lg.dtype)
        return lg.cpu().numpy()

    def free(self):
        del self.model
        if self.torch.cuda.is_available():
            self.torch.cuda.empty_cache()


class NumpyStandin:
    """--hf-standin numpy: tests/gemma4_ref.py's float64 forward pass in HF's place, to test this script
    (models, isobatch's logits, the weight reading and dequantization, the comparison, --perturb)
    where torch and transformers are not installed. Not the check the issue asks for."""

    def __init__(self, tc, W, perturb):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        import gemma4_ref
        self.ref, self.tc, self.W = gemma4_ref, tc, dict(W)
        if perturb:
            w = self.W["model.norm.weight"].copy()
            w[0] *= 1.01
            self.W["model.norm.weight"] = w
            log("--perturb: the stand-in's model.norm.weight[0] multiplied by 1.01 (this run must FAIL)")

    margins = None   # the stand-in does not report its routing

    def logits(self, ids, float64_internals):
        return self.ref.forward(self.tc, self.W, ids)

    def free(self):
        self.W = None


# ---------------------------------------------------------------- cases

def describe(tc, bits, notes):
    lt = tc["layer_types"]
    ghd = tc.get("global_head_dim") or tc["head_dim"]
    gkv = tc.get("num_global_key_value_heads") if tc.get("attention_k_eq_v") else tc["num_key_value_heads"]
    s = ("D %d, %d layers (%s), %d heads; sliding layers head_dim %d x %d KV heads, window %d; full layers "
         "head_dim %d x %s KV heads%s; dense F %d; vocab %d" %
         (tc["hidden_size"], len(lt), " ".join("S" if t == "sliding_attention" else "F" for t in lt),
          tc["num_attention_heads"], tc["head_dim"], tc["num_key_value_heads"], tc["sliding_window"], ghd, gkv,
          " (K = V)" if tc.get("attention_k_eq_v") else "", tc["intermediate_size"], tc["vocab_size"]))
    if tc.get("hidden_size_per_layer_input"):
        s += "; per-layer embeddings of width %d" % tc["hidden_size_per_layer_input"]
    if tc.get("num_kv_shared_layers"):
        s += "; the last %d layers KV-shared" % tc["num_kv_shared_layers"]
        if tc.get("use_double_wide_mlp"):
            s += " with MLPs of F %d (use_double_wide_mlp)" % (2 * tc["intermediate_size"])
    if tc.get("enable_moe_block"):
        s += "; %d experts, top-%d, expert F %d" % (tc["num_experts"], tc["top_k_experts"], tc["moe_intermediate_size"])
    if notes:
        s += "; weights MLX %d-bit, group %d (dequantized here in float64)" % (notes[0][1], notes[0][2])
    else:
        s += "; weights %s" % ("float32" if bits == 32 else "bfloat16" if bits == 16 else "float")
    return s


def prompts_for(tc, seed, max_tokens=0):
    """Prompts of token ids: 23 and 41 tokens, and sliding_window + 40 (past the window); with a long
    window (the real shapes' 1024) only 23 and sliding_window + 40, to keep the run short. max_tokens > 0
    cuts each to its first max_tokens ids (the same ids, so a prefix of the same positions)."""
    rng = np.random.default_rng(seed)
    V = tc["vocab_size"]
    W = tc["sliding_window"]
    lens = [23, 41, W + 40] if W <= 256 else [23, W + 40]
    ps = [[int(t) for t in rng.integers(3, V, size=n)] for n in lens]
    return [p[:max_tokens] if max_tokens > 0 else p for p in ps]


def run_case(name, a, work):
    preset, bits, seed, extra, what = CASES[name]
    if extra is None:
        extra = ["--layers", str(a.real_layers)]
    mdir = os.path.join(work, name)
    log("\n== %s: %s (mkmodel --preset %s --bits %d --seed %d %s)" % (name, what, preset, bits, seed, " ".join(extra)))
    run([a.isobatch, "mkmodel", "--preset", preset, "--bits", str(bits), "--seed", str(seed), "--out", mdir] + extra,
        "isobatch mkmodel")
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    tc = text_config(cfg)
    small = tc["vocab_size"] * tc["hidden_size"] * len(tc["layer_types"]) < 5e7
    refs = a.refs == "yes" or (a.refs == "auto" and small)          # the numpy reference
    def c_ref(ids):   # the C reference: on the real shapes only the first prompt (2 threads, slow)
        return a.refs == "yes" or (a.refs == "auto" and (small or len(ids) <= 32))
    prompts = prompts_for(tc, seed, a.max_tokens)
    V = tc["vocab_size"]

    eng, cref = [], []   # isobatch first: its process is gone before the float64 weights are read here
    for i, ids in enumerate(prompts):
        e, r, js, secs = isobatch_logits(a.isobatch, mdir, ids, V, os.path.join(work, "%s_p%d.f32" % (name, i)),
                                         os.path.join(work, "%s_p%d.ref.f64" % (name, i)) if c_ref(ids) else None,
                                         a.threads)
        log("isobatch prompt %d (%d tokens): %.1f s: %s" % (i, len(ids), secs, js))
        eng.append(e)
        cref.append(r)
        if not a.keep:
            for p in (os.path.join(work, "%s_p%d.f32" % (name, i)), os.path.join(work, "%s_p%d.ref.f64" % (name, i))):
                if os.path.exists(p):
                    os.remove(p)

    t0 = time.time()
    W, notes = load_weights(mdir, cfg)
    log("shapes: " + describe(tc, bits, notes))
    log("weights read and dequantized in %.1f s (%d tensors, %.2f G values)" %
        (time.time() - t0, len(W), sum(v.size for v in W.values()) / 1e9))

    npref = []
    if refs:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        import gemma4_ref   # the project's numpy float64 forward pass
        for ids in prompts:
            npref.append(gemma4_ref.forward(tc, W, ids))

    modes = {"both": ["float64", "stock"], "float64": ["float64"], "stock": ["stock"]}[a.hf_mode]
    if a.hf_standin:
        modes = ["float64"]      # the stand-in is float64 throughout
    hf = NumpyStandin(tc, W, a.perturb) if a.hf_standin == "numpy" else HF(cfg, W, a.device, a.perturb)
    del W
    res = {"case": name, "preset": preset, "bits": bits, "mkmodel_flags": extra, "shapes": describe(tc, bits, notes),
           "prompt_lengths": [len(p) for p in prompts]}
    verdict_mode = modes[0]
    for mode in modes:
        per = []
        for i, ids in enumerate(prompts):
            try:
                t0 = time.time()
                h = hf.logits(ids, mode == "float64")
            except SetupError as e:
                log("HF %s: %s" % (mode, e))
                res[mode] = {"error": str(e)}
                per = None
                break
            m = compare(eng[i], h)
            per.append(m)
            log("prompt %d, %d tokens: isobatch f32 vs HF %s: %s  [HF %.1f s]" % (i, len(ids), mode, fmt(m),
                                                                                   time.time() - t0))
            mg = getattr(hf, "margins", None)
            if mg is not None and len(mg) == len(ids):
                # how close each position's routed set came to a tie (k-th vs (k+1)-th router logit, relative,
                # the smallest over the layers): under about 1e-6 two correct float implementations may route
                # that position differently, and every later position attends to it
                m["router_margin_min"] = float(mg.min())
                m["router_margin_argmin"] = int(mg.argmin())
                log("    router: smallest relative gap between the k-th and (k+1)-th logit %.3g at position %d; "
                    "%d positions under 1e-6" % (mg.min(), mg.argmin(), int(np.sum(mg < 1e-6))))
            if npref:
                mn = compare(npref[i], h)
                log("    numpy float64 reference (tests/gemma4_ref.py) vs HF %s: %s" % (mode, fmt(mn)))
            if cref[i] is not None:
                mc = compare(cref[i], h)
                log("    C float64 reference (isobatch accuracy) vs HF %s: %s" % (mode, fmt(mc)))
                if mode == modes[0]:
                    log("    isobatch f32 vs the C float64 reference: %s" % fmt(compare(eng[i], cref[i])))
        if per is not None:
            res[mode] = merge(per)
            res[mode]["per_prompt"] = per
    if npref:
        res["isobatch_vs_numpy_ref"] = merge([compare(eng[i], npref[i]) for i in range(len(prompts))])
    if any(r is not None for r in cref):
        res["isobatch_vs_c_ref"] = merge([compare(eng[i], cref[i]) for i in range(len(prompts)) if cref[i] is not None])
    hf.free()
    v = res.get(verdict_mode)
    ok = bool(v) and "error" not in v and all(passes(m) for m in v["per_prompt"])
    res["verdict_on"] = verdict_mode
    res["pass"] = ok
    if v and "error" not in v:
        log("%s: %s: rel L2 %.3g (the largest prompt's; at one position at most %.3g), top-1 %d/%d, vs HF %s "
            "(need rel L2 <= %g and every top-1)" % ("PASS" if ok else "FAIL", name, v["rel_l2_all_max"],
                                                     v["max_rel_l2"], v["top1"], v["positions"], verdict_mode,
                                                     TOL_REL_L2))
    else:
        log("FAIL: %s: no HF %s logits" % (name, verdict_mode))
    if not a.keep:
        for f in os.listdir(mdir):
            os.remove(os.path.join(mdir, f))
        os.rmdir(mdir)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isobatch", default="build/isobatch", help="the isobatch binary (default build/isobatch)")
    ap.add_argument("--work", required=True, help="directory for the models and logits (created)")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated, of %s (default all)" % ", ".join(CASES))
    ap.add_argument("--real-layers", type=int, default=6, help="layers of the real-shape case (default 6: five "
                    "sliding and one full, the 26B-A4B pattern's first period)")
    ap.add_argument("--device", default="auto", help="torch device for HF: auto (cuda when available), cuda, cpu")
    ap.add_argument("--hf-mode", default="both", choices=["both", "float64", "stock"],
                    help="HF with its float32 internals in float64 (the verdict), as shipped, or both (default)")
    ap.add_argument("--refs", default="auto", choices=["auto", "yes", "no"],
                    help="also the project's float64 references (numpy and C) on the same weights, for information "
                         "(auto: both on the small cases, the C one on the real shapes' first prompt, 23 tokens)")
    ap.add_argument("--perturb", action="store_true", help="change one HF weight slightly: every case must FAIL")
    ap.add_argument("--isobatch-libs", help="a directory of shared libraries for the isobatch binary only "
                    "(put first on its LD_LIBRARY_PATH; torch and transformers keep this process's)")
    ap.add_argument("--hf-standin", choices=["numpy"], help="testing this script without torch: the numpy "
                    "reference (tests/gemma4_ref.py) takes HF's place (not the check itself)")
    ap.add_argument("--max-tokens", type=int, default=0, help="cut every prompt to its first N ids (a prefix "
                    "of the same positions; with --refs yes the C reference then runs on the real shapes' long prompt)")
    ap.add_argument("--threads", type=int, default=0, help="isobatch threads (default: every CPU)")
    ap.add_argument("--keep", action="store_true", help="keep the models and logits files")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    names = [c for c in a.cases.split(",") if c]
    for c in names:
        if c not in CASES:
            log("unknown case %r (%s)" % (c, ", ".join(CASES)))
            return 2
    global ISOBATCH_ENV
    if a.isobatch_libs:
        ISOBATCH_ENV = dict(os.environ)
        old = ISOBATCH_ENV.get("LD_LIBRARY_PATH")
        ISOBATCH_ENV["LD_LIBRARY_PATH"] = a.isobatch_libs + (":" + old if old else "")
    if not os.access(a.isobatch, os.X_OK):
        log("%s: not an executable" % a.isobatch)
        return 2
    if a.hf_standin:
        a.device = "cpu (numpy stand-in for HF)"
    elif a.device == "auto":
        try:
            import torch
            a.device = "cuda" if torch.cuda.is_available() else "cpu"
        except Exception as e:   # noqa: BLE001
            log("torch is not importable: %s" % e)
            return 2
    os.makedirs(a.work, exist_ok=True)
    log("gemma4_hf_check: cases %s, HF mode %s (verdict on %s), device %s, tolerance: relative L2 over each "
        "prompt's logits <= %g and top-1 100%%%s" % (",".join(names), a.hf_mode, "stock" if a.hf_mode == "stock" else
                                               "float64", a.device, TOL_REL_L2, ", PERTURBED" if a.perturb else ""))
    results, rc = [], 0
    for c in names:
        try:
            r = run_case(c, a, a.work)
        except SetupError as e:
            log("SETUP ERROR in case %s: %s" % (c, e))
            results.append({"case": c, "pass": False, "setup_error": str(e)})
            rc = 2
            continue
        except Exception as e:   # noqa: BLE001 (e.g. transformers refusing something: show it, go on)
            import traceback
            traceback.print_exc(file=sys.stdout)
            log("SETUP ERROR in case %s: %s: %s" % (c, type(e).__name__, e))
            results.append({"case": c, "pass": False, "setup_error": "%s: %s" % (type(e).__name__, e)})
            rc = 2
            continue
        results.append(r)
        if not r["pass"] and rc == 0:
            rc = 1
    log("\nsummary:")
    for r in results:
        v = r.get(r.get("verdict_on", ""), None)
        if r.get("setup_error"):
            log("  %-8s SETUP ERROR: %s" % (r["case"], r["setup_error"].splitlines()[0]))
        elif v and "error" not in v:
            extra = ""
            if "stock" in r and r["stock"] and "error" not in r["stock"] and r["verdict_on"] != "stock":
                extra = "; HF as shipped: rel L2 %.3g, top-1 %d/%d" % (r["stock"]["rel_l2_all_max"],
                                                                      r["stock"]["top1"], r["stock"]["positions"])
            log("  %-8s %s  rel L2 %.3g (one position at most %.3g), top-1 %d/%d, vs HF %s%s" %
                (r["case"], "PASS" if r["pass"] else "FAIL", v["rel_l2_all_max"], v["max_rel_l2"], v["top1"],
                 v["positions"], r["verdict_on"], extra))
        else:
            log("  %-8s FAIL  (no HF logits)" % r["case"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tolerance_rel_l2": TOL_REL_L2, "perturbed": a.perturb, "device": a.device, "results": results},
                      f, indent=1)
    log("gemma4_hf_check: %s" % ("all PASS" if rc == 0 else "FAIL" if rc == 1 else "SETUP ERROR"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
