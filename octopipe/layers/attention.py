"""Softmax attention (GQA, causal or sliding-window, via SDPA) and multi-head latent attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.model.layer import LayerSpec


def attention_mask(q_len: int, k_len: int, causal: bool, window: int) -> torch.Tensor | None:
    """Boolean mask (True = attend): causal and, when `window` > 0, at most `window` keys back."""
    if not causal and window <= 0:
        return None
    i = torch.arange(q_len)[:, None] + (k_len - q_len)
    j = torch.arange(k_len)[None, :]
    mask = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        mask &= j <= i
    if window > 0:
        mask &= (i - j) < window
        if not causal:
            mask &= (j - i) < window
    return mask


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int) -> torch.Tensor:
    """q: [b, h, s, d]; k, v: [b, kv, s, d]; kv heads are shared by groups of query heads (GQA)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    mask = attention_mask(q.shape[2], k.shape[2], causal, window)
    if mask is not None:
        mask = mask.to(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(nn.Module):
    """Pre-norm residual self-attention with grouped-query heads (optional QK-norm and biases).
    `kv_heads` selects that many key/value heads with their query heads (a piece of the layer,
    see `octopipe.layers.pieces`; default all of them); `norm` and `o_bias` say whether this
    module holds the pre-norm and the output projection's bias (a piece after the first does not)."""

    def __init__(self, spec: LayerSpec, kv_heads: int = 0, norm: bool = True, o_bias: bool = True) -> None:
        super().__init__()
        h, hd = spec.heads, spec.head_dim or spec.hidden // max(spec.heads, 1)
        kv = spec.kv_heads or h
        if h % kv:
            raise ValueError(f"attention layer {spec.label}: heads={h} is not a multiple of kv_heads={kv}")
        rep = h // kv
        kv = kv_heads or kv
        self.heads, self.kv, self.hd = kv * rep, kv, hd
        self.causal, self.window = spec.causal, spec.window
        self.norm = nn.RMSNorm(spec.hidden) if norm else None
        self.q = nn.Linear(spec.hidden, self.heads * hd, bias=spec.bias)
        self.kv_proj = nn.Linear(spec.hidden, 2 * kv * hd, bias=spec.bias)
        self.o = nn.Linear(self.heads * hd, spec.hidden, bias=spec.bias and o_bias)
        self.qk_norm = nn.ModuleList([nn.RMSNorm(hd), nn.RMSNorm(hd)]) if spec.qk_norm else None

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, s, 2, self.kv, self.hd).unbind(2)
        if self.qk_norm is not None:
            q, k = self.qk_norm[0](q), self.qk_norm[1](k)
        y = sdpa(q, k.transpose(1, 2), v.transpose(1, 2), self.causal, self.window)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        return x + self.mix(self.norm(x))


class MLA(nn.Module):
    """Multi-head latent attention: low-rank queries and a compressed, shared key/value latent
    with a decoupled rotary part shared by all heads (DeepSeek-V3 layout, without RoPE)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        h = spec.heads
        self.h, self.nope, self.rope, self.vd = h, spec.qk_nope_dim, spec.qk_rope_dim, spec.v_head_dim
        self.kv_rank, self.window = spec.kv_lora_rank, spec.window
        qd = h * (self.nope + self.rope)
        self.norm = nn.RMSNorm(spec.hidden)
        if spec.q_lora_rank:
            self.q = nn.Sequential(nn.Linear(spec.hidden, spec.q_lora_rank, bias=False),
                                   nn.RMSNorm(spec.q_lora_rank), nn.Linear(spec.q_lora_rank, qd, bias=False))
        else:
            self.q = nn.Linear(spec.hidden, qd, bias=False)
        self.kv_a = nn.Linear(spec.hidden, self.kv_rank + self.rope, bias=False)
        self.kv_norm = nn.RMSNorm(self.kv_rank)
        self.kv_b = nn.Linear(self.kv_rank, h * (self.nope + self.vd), bias=False)
        self.o = nn.Linear(h * self.vd, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        y = self.norm(x)
        b, s, _ = y.shape
        q = self.q(y).view(b, s, self.h, self.nope + self.rope).transpose(1, 2)
        latent, k_rope = self.kv_a(y).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b(self.kv_norm(latent)).view(b, s, self.h, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        k_rope = k_rope[:, None].expand(b, self.h, s, self.rope)
        k = torch.cat([k_nope, k_rope], dim=-1)
        out = sdpa(q, k, v, causal=True, window=self.window)
        return x + self.o(out.transpose(1, 2).reshape(b, s, -1))


class LinearAttention(nn.Module):
    """Lightning-style causal linear attention with a per-head exponential decay, computed in
    blocks: a masked quadratic product inside each block plus a recurrent state across blocks."""

    block = 64

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        h, hd = spec.heads, spec.head_dim or spec.hidden // max(spec.heads, 1)
        self.h, self.hd = h, hd
        self.norm = nn.RMSNorm(spec.hidden)
        self.qkv = nn.Linear(spec.hidden, 3 * h * hd, bias=False)
        self.gate = nn.Linear(spec.hidden, h * hd, bias=False)
        self.out_norm = nn.RMSNorm(h * hd)
        self.o = nn.Linear(h * hd, spec.hidden, bias=False)
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])
        self.register_buffer("log_decay", torch.log1p(-slopes), persistent=False)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        y = self.norm(x)
        b, s, _ = y.shape
        q, k, v = (F.silu(t).transpose(1, 2) for t in self.qkv(y).view(b, s, 3, self.h, self.hd).unbind(2))
        out = lightning(q, k, v, self.log_decay, self.block)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return x + self.o(self.out_norm(out) * torch.sigmoid(self.gate(y)))


def lightning(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
              block: int) -> torch.Tensor:
    """o_t = sum_{i<=t} lambda^(t-i) (q_t . k_i) v_i per head; q, k, v: [b, h, s, d]."""
    b, h, s, d = q.shape
    ld = log_decay.view(1, h, 1, 1)
    state = q.new_zeros(b, h, d, v.shape[-1])
    outs = []
    for lo in range(0, s, block):
        qb, kb, vb = q[:, :, lo:lo + block], k[:, :, lo:lo + block], v[:, :, lo:lo + block]
        n = qb.shape[2]
        pos = torch.arange(n, device=q.device, dtype=q.dtype)
        diff = pos[:, None] - pos[None, :]
        intra_mask = torch.exp(ld * diff.clamp(min=0)) * (diff >= 0)
        intra = ((qb @ kb.transpose(-1, -2)) * intra_mask) @ vb
        inter = (qb * torch.exp(ld * (pos[:, None] + 1))) @ state
        outs.append(intra + inter)
        k_decay = torch.exp(ld * (n - 1 - pos)[:, None])
        state = torch.exp(ld * n) * state + (kb * k_decay).transpose(-1, -2) @ vb
    return torch.cat(outs, dim=2)
