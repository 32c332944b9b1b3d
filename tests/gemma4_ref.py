#!/usr/bin/env python3
"""A float64 reference forward pass of a Gemma 4 text model (model_type gemma4_text), written from
the architecture's description (docs/gemma4.md), independent of isobatch's C code.

usage: gemma4_ref.py MODEL_DIR IDS LOGITS_BIN FIRST
       gemma4_ref.py MODEL_DIR IDS --npy REF.npy   (the reference against saved float64 logits)
  IDS         comma-separated token ids of the whole sequence (prompt, then generated tokens)
  LOGITS_BIN  float32 rows written by `isobatch generate --logits-out` for that sequence
  FIRST       position whose logits are the first row of LOGITS_BIN (the prompt's last token)
Prints the relative L2 error of the engine's rows against the reference and the top-1 agreement;
exits 1 when the error exceeds 1e-5 or a top-1 token differs.
"""
import json
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[a:b]
        if e["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit("reference: float32/bfloat16 weights only (%s is %s)" % (name, e["dtype"]))
        out[name] = arr.reshape(e["shape"]).astype(np.float64)
    return out


def rmsnorm(x, w, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rotate(x, pos, theta, n_rot):
    """Split-halves rotary embedding of x [T, heads, hd]; pairs i >= n_rot keep frequency 0."""
    hd = x.shape[-1]
    half = hd // 2
    i = np.arange(half, dtype=np.float64)
    inv = np.where(i < n_rot, theta ** (-(2.0 * i) / hd), 0.0)
    ang = pos[:, None] * inv[None, :]                        # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def experts(W, p, E):
    """Each expert's gate, up and down [E][out, in], stored either as mlx-lm's SwitchGLU or as
    transformers' gate_up_proj / down_proj."""
    if p + "experts.gate_up_proj" in W:
        gu = W[p + "experts.gate_up_proj"]
        F = gu.shape[1] // 2
        return gu[:, :F, :], gu[:, F:, :], W[p + "experts.down_proj"]
    s = p + "experts.switch_glu."
    return W[s + "gate_proj.weight"], W[s + "up_proj.weight"], W[s + "down_proj.weight"]


def moe(cfg, W, p, h, eps):
    """Gemma 4's routed experts on the residual h [T, D]: the router reads h (normed without a weight,
    times router.scale and 1/sqrt(D)), softmax, top-k, renormalised, times per_expert_scale; the
    experts read pre_feedforward_layernorm_2(h)."""
    D, E, k = h.shape[1], cfg["num_experts"], cfg["top_k_experts"]
    r = rmsnorm(h, None, eps) * W[p + "router.scale"] * D ** -0.5
    logits = r @ W[p + "router.proj.weight"].T                       # [T, E]
    pr = np.exp(logits - logits.max(axis=1, keepdims=True))
    pr /= pr.sum(axis=1, keepdims=True)
    x = rmsnorm(h, W[p + "pre_feedforward_layernorm_2.weight"], eps)
    g, u, d = experts(W, p, E)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        sel = sorted(range(E), key=lambda e: (-logits[t, e], e))[:k]  # ties to the lowest id
        w = pr[t, sel] / pr[t, sel].sum() * W[p + "router.per_expert_scale"][sel]
        for j, e in enumerate(sel):
            out[t] += w[j] * (d[e] @ (gelu_tanh(g[e] @ x[t]) * (u[e] @ x[t])))
    return out


def forward(cfg, W, ids):
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    hd_s, hd_f = cfg["head_dim"], cfg.get("global_head_dim") or cfg["head_dim"]
    kv_s = cfg["num_key_value_heads"]
    k_eq_v = cfg.get("attention_k_eq_v", False)
    kv_f = cfg.get("num_global_key_value_heads") or kv_s if k_eq_v else kv_s
    plc = [v for v in (cfg.get("per_layer_config") or {}).values()]   # newer transformers' form
    if plc:
        hd_f = plc[0].get("head_dim", hd_f)
        kv_f = plc[0].get("num_key_value_heads", kv_f)
    window = cfg["sliding_window"]
    rp = cfg["rope_parameters"]
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    emb = W["model.embed_tokens.weight"]
    # the scale is a float32 buffer in transformers (sqrt(D) rounded to float32), cast to the weights dtype
    h = emb[ids] * float(np.float32(np.sqrt(D)))
    # KV sharing: the last num_kv_shared_layers layers attend to the keys and values of the last layer
    # before them of their own type (computing none of their own)
    types = cfg["layer_types"]
    first_shared = len(types) - (cfg.get("num_kv_shared_layers") or 0)
    source = {li: max(j for j in range(first_shared) if types[j] == types[li])
              for li in range(first_shared, len(types))}
    kept = {}   # layer -> (k, v) after norms and RoPE, for the shared layers
    # per-layer embeddings (hidden_size_per_layer_input P): each token's [L][P] inputs, from its
    # embedding's projection (times 1/sqrt(D), normed per layer slice) and its per-layer table row
    # (times sqrt(P) as a float32), the two summed and times 1/sqrt(2)
    P = cfg.get("hidden_size_per_layer_input") or 0
    if P:
        L = len(types)
        proj = (h @ W["model.per_layer_model_projection.weight"].T) * D ** -0.5
        proj = rmsnorm(proj.reshape(T, L, P), W["model.per_layer_projection_norm.weight"], eps)
        tok = W["model.embed_tokens_per_layer.weight"][ids].reshape(T, L, P) * float(np.float32(np.sqrt(P)))
        pli = (proj + tok) * 2.0 ** -0.5
    for li, typ in enumerate(types):
        p = "model.layers.%d." % li
        sliding = typ == "sliding_attention"
        hd, kvh = (hd_s, kv_s) if sliding else (hd_f, kv_f)
        r = rp[typ]
        theta = r["rope_theta"]
        n_rot = hd // 2
        if r.get("rope_type", "default") == "proportional":
            n_rot = int(r.get("partial_rotary_factor", 1.0) * hd // 2)
        x = rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        q = (x @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd)
        q = rotate(rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps), pos, theta, n_rot)
        if li in source:
            k, v = kept[source[li]]
        else:
            k_raw = (x @ W[p + "self_attn.k_proj.weight"].T).reshape(T, kvh, hd)
            if k_eq_v and not sliding:
                v = k_raw
            else:
                v = (x @ W[p + "self_attn.v_proj.weight"].T).reshape(T, kvh, hd)
            k = rotate(rmsnorm(k_raw, W[p + "self_attn.k_norm.weight"], eps), pos, theta, n_rot)
            v = rmsnorm(v, None, eps)
            kept[li] = (k, v)
        g = H // kvh
        att = np.zeros((T, H, hd))
        qi = np.arange(T)[:, None]
        kj = np.arange(T)[None, :]
        allowed = kj <= qi
        if sliding:
            allowed = allowed & (kj > qi - window)
        for hh in range(H):
            sc = q[:, hh, :] @ k[:, hh // g, :].T            # scaling 1
            sc = np.where(allowed, sc, -np.inf)
            sc = sc - sc.max(axis=1, keepdims=True)
            pr = np.exp(sc)
            pr /= pr.sum(axis=1, keepdims=True)
            att[:, hh, :] = pr @ v[:, hh // g, :]
        o = att.reshape(T, H * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = h + rmsnorm(o, W[p + "post_attention_layernorm.weight"], eps)
        x = rmsnorm(h, W[p + "pre_feedforward_layernorm.weight"], eps)
        # the dense MLP's width from the config, as transformers builds it: 2 x intermediate_size on a
        # KV-shared layer when use_double_wide_mlp (its gate/up/down must have that shape)
        F = cfg["intermediate_size"] * (2 if cfg.get("use_double_wide_mlp") and 0 < first_shared <= li else 1)
        for nm, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            got = W[p + "mlp." + nm + ".weight"].shape
            if tuple(got) != shape:
                raise SystemExit("layer %d mlp.%s: shape %s, the config says %s" % (li, nm, tuple(got), shape))
        a = gelu_tanh(x @ W[p + "mlp.gate_proj.weight"].T) * (x @ W[p + "mlp.up_proj.weight"].T)
        m = a @ W[p + "mlp.down_proj.weight"].T
        if cfg.get("enable_moe_block"):
            m = rmsnorm(m, W[p + "post_feedforward_layernorm_1.weight"], eps) + \
                rmsnorm(moe(cfg, W, p, h, eps), W[p + "post_feedforward_layernorm_2.weight"], eps)
        h = h + rmsnorm(m, W[p + "post_feedforward_layernorm.weight"], eps)
        if P:
            g = gelu_tanh(h @ W[p + "per_layer_input_gate.weight"].T) * pli[:, li, :]
            h = h + rmsnorm(g @ W[p + "per_layer_projection.weight"].T, W[p + "post_per_layer_input_norm.weight"], eps)
        h = h * W[p + "layer_scalar"].reshape(())
    h = rmsnorm(h, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else emb
    logits = h @ head.T
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits


def main():
    d, ids, binf, first = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3], sys.argv[4]
    cfg = json.load(open(d + "/config.json"))
    if cfg.get("model_type") != "gemma4_text":
        raise SystemExit("reference: model_type gemma4_text only")
    W = load_safetensors(d + "/model.safetensors")
    V = cfg["vocab_size"]
    if binf == "--npy":  # compare this reference with another's logits of every position
        other = np.load(sys.argv[4])
        ref = forward(cfg, W, ids)
        rel = np.linalg.norm(ref - other) / np.linalg.norm(other)
        print("gemma4 reference against %s: relative L2 %.3g" % (sys.argv[4], rel))
        return 0 if rel <= 1e-5 else 1
    first = int(first)
    got = np.fromfile(binf, dtype="<f4").astype(np.float64).reshape(-1, V)
    ref = forward(cfg, W, ids)[first:first + got.shape[0]]
    if ref.shape != got.shape:
        raise SystemExit("reference: %d engine rows, %d reference rows" % (got.shape[0], ref.shape[0]))
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    top1 = int(np.sum(np.argmax(got, axis=1) == np.argmax(ref, axis=1)))
    ok = rel <= 1e-5 and top1 == got.shape[0]
    print("gemma4 reference: %d rows, relative L2 %.3g, top-1 %d/%d %s" %
          (got.shape[0], rel, top1, got.shape[0], "ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
