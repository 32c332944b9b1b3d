#!/usr/bin/env python3
"""model.py — the Qwen3 architecture in PyTorch, with Hugging Face parameter names.

Per layer: x += o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v)) on input_layernorm(x);
x += down_proj(silu(gate_proj(h)) * up_proj(h)) on h = post_attention_layernorm(x).
RMSNorm over the last dimension (q_norm/k_norm per head, weight [head_dim]); RoPE on split halves
(x[:h/2], x[h/2:]), inv_freq_i = theta^(-2i/head_dim); grouped-query attention (query head h reads
kv head h // (n_heads / n_kv_heads)); causal softmax with scale 1/sqrt(head_dim); no biases; the
lm_head is the embedding matrix (tied). Parameter names match the HF/mlx-lm checkpoint keys
(model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight).

`config` is a dict with the keys of a Qwen3 config.json (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size, rms_norm_eps,
rope_theta, max_position_embeddings) and optionally `dropout` (training only, on residual branches).
Works with torch 1.13 (manual attention) and torch >= 2 (fused scaled_dot_product_attention).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(positions, head_dim, theta, dtype=torch.float32):
    """cos, sin of shape [T, head_dim/2] for integer positions [T], computed in float64."""
    half = head_dim // 2
    inv = torch.exp(-(torch.arange(half, dtype=torch.float64) * 2.0 / head_dim) * math.log(theta))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]; cos/sin [T, hd/2]: rotate split halves."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, H, KV, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.H, self.KV, self.hd = H, KV, hd
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.k_proj = nn.Linear(D, KV * hd, bias=False)
        self.v_proj = nn.Linear(D, KV * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.hd)).transpose(1, 2)    # [B][H][T][hd]
        k = self.k_norm(self.k_proj(x).view(B, T, self.KV, self.hd)).transpose(1, 2)   # [B][KV][T][hd]
        v = self.v_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)                # [B][KV][T][hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.H // self.KV
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention") and x.is_cuda:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))                 # [B][H][T][T]
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
            o = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, F_ = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(D, F_, bias=False)
        self.up_proj = nn.Linear(D, F_, bias=False)
        self.down_proj = nn.Linear(F_, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.drop = nn.Dropout(c.get("dropout", 0.0))

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        self.model = Inner(c)

    def init_weights(self, seed):
        """Normal(0, 0.02) for every matrix, output projections (o_proj, down_proj) scaled by
        1/sqrt(2 * layers); norms at 1."""
        g = torch.Generator().manual_seed(seed)
        L = self.config["num_hidden_layers"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                with torch.no_grad():
                    p.fill_(1.0)

    def hidden(self, ids, start_pos=0):
        """Final-normed hidden states [B][T][D] for ids [B][T] at positions start_pos.."""
        T = ids.shape[1]
        pos = torch.arange(start_pos, start_pos + T)
        cos, sin = rope_tables(pos, self.config["head_dim"], self.config["rope_theta"])
        cos, sin = cos.to(ids.device), sin.to(ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, ids, start_pos=0):
        """Logits [B][T][V] (tied lm_head)."""
        h = self.hidden(ids, start_pos)
        return h @ self.model.embed_tokens.weight.to(h.dtype).t()


def n_params(model):
    return sum(p.numel() for p in model.parameters())
