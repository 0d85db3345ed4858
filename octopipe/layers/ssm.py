"""State-space mixers in plain torch: Mamba-2 (SSD, chunked scan) and Mamba-1 (selective scan)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.model.layer import LayerSpec


def segsum(x: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = sum(x[..., j+1:i+1]) for j <= i, -inf above the diagonal."""
    t = x.shape[-1]
    x = x[..., None].expand(*x.shape, t)
    lower = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), -1)
    x = x.masked_fill(~lower, 0.0).cumsum(dim=-2)
    return x.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device)), float("-inf"))


def ssd_scan(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mamba-2's structured state-space duality, chunked: quadratic inside a chunk, a recurrence
    of chunk states across chunks. x: [B, L, H, P]; a: [B, L, H] (log decay); b, c: [B, L, H, N].
    Returns y with y_t = sum_{i<=t} exp(a_{i+1} + ... + a_t) (c_t . b_i) x_i.
    """
    bsz, length, h, p = x.shape
    pad = (-length) % chunk
    if pad:
        x, a, b, c = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, a, b, c))
    n_chunks = x.shape[1] // chunk
    x, b, c = (t.reshape(bsz, n_chunks, chunk, h, -1) for t in (x, b, c))
    a = a.reshape(bsz, n_chunks, chunk, h).permute(0, 3, 1, 2)          # [B, H, C, L]
    a_cum = a.cumsum(dim=-1)
    decay = torch.exp(segsum(a))                                          # [B, H, C, L, L]
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, decay, x)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_states, x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(bsz, n_chunks * chunk, h, p)
    return y[:, :length]


class GroupRMSNorm(nn.Module):
    """RMSNorm over each of `groups` equal slices of the last dimension, with one weight per
    channel: Mamba-2's gated norm (`RMSNormGated`, `group_size = d_inner / ngroups`), which keeps
    the groups independent (one group: a plain RMSNorm)."""

    def __init__(self, width: int, groups: int) -> None:
        super().__init__()
        if width % groups:
            raise ValueError(f"GroupRMSNorm: width {width} is not a multiple of groups={groups}")
        self.groups = groups
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        g = y.unflatten(-1, (self.groups, -1))
        return F.rms_norm(g, (g.shape[-1],)).flatten(-2) * self.weight


class Mamba2(nn.Module):
    """Pre-norm residual Mamba-2 mixer: in-projection, causal depthwise conv, SSD scan, gated
    norm per group. `groups` selects that many of the layer's groups with their heads (a piece of
    it, see `octopipe.layers.pieces`; default all of them); `norm`: whether it holds the pre-norm."""

    def __init__(self, spec: LayerSpec, groups: int = 0, norm: bool = True) -> None:
        super().__init__()
        g_all = max(spec.ssm_groups, 1)
        self.g = groups or g_all
        self.h = spec.ssm_heads * self.g // g_all
        self.p = spec.ssm_head_dim
        self.n = spec.ssm_state
        self.chunk = spec.ssm_chunk
        inner = self.h * self.p
        self.conv_dim = inner + 2 * self.g * self.n
        self.norm = nn.RMSNorm(spec.hidden) if norm else None
        self.in_proj = nn.Linear(spec.hidden, inner + self.conv_dim + self.h, bias=False)
        self.conv = nn.Conv1d(self.conv_dim, self.conv_dim, spec.conv_kernel, groups=self.conv_dim,
                              padding=spec.conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.linspace(1e-3, 1e-1, self.h))))
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, self.h)))
        self.d = nn.Parameter(torch.ones(self.h))
        self.out_norm = GroupRMSNorm(inner, self.g)
        self.out_proj = nn.Linear(inner, spec.hidden, bias=False)

    def mix(self, n: torch.Tensor) -> torch.Tensor:
        """The mixer on normalized input `n`, before the residual."""
        bsz, length, _ = n.shape
        inner = self.h * self.p
        z, xbc, dt = self.in_proj(n).split([inner, self.conv_dim, self.h], dim=-1)
        xbc = F.silu(self.conv(xbc.transpose(1, 2))[..., :length].transpose(1, 2))
        xs, b, c = xbc.split([inner, self.g * self.n, self.g * self.n], dim=-1)
        dt = F.softplus(dt + self.dt_bias)                                   # [B, L, H]
        a = -torch.exp(self.a_log) * dt
        rep = self.h // self.g
        b = b.view(bsz, length, self.g, self.n).repeat_interleave(rep, dim=2)
        c = c.view(bsz, length, self.g, self.n).repeat_interleave(rep, dim=2)
        xs = xs.view(bsz, length, self.h, self.p)
        y = ssd_scan(xs * dt[..., None], a, b, c, self.chunk) + xs * self.d[:, None]
        return self.out_proj(self.out_norm(y.reshape(bsz, length, inner) * F.silu(z)))

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        return x + self.mix(self.norm(x))


class Mamba1(nn.Module):
    """Pre-norm residual Mamba-1 mixer with a sequential selective scan (fine at tiny lengths)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        inner = spec.ssm_heads * spec.ssm_head_dim if spec.ssm_heads else 2 * spec.hidden
        self.inner, self.n = inner, spec.ssm_state
        self.dt_rank = spec.dt_rank or math.ceil(spec.hidden / 16)
        self.norm = nn.RMSNorm(spec.hidden)
        self.in_proj = nn.Linear(spec.hidden, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, spec.conv_kernel, groups=inner, padding=spec.conv_kernel - 1)
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * self.n, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, inner)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, self.n + 1, dtype=torch.float32)).repeat(inner, 1))
        self.d = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        length = x.shape[1]
        xs, z = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        xs = F.silu(self.conv(xs.transpose(1, 2))[..., :length].transpose(1, 2))
        dt, b, c = self.x_proj(xs).split([self.dt_rank, self.n, self.n], dim=-1)
        dt = F.softplus(self.dt_proj(dt))                                 # [B, L, D]
        decay = torch.exp(dt[..., None] * -torch.exp(self.a_log))         # [B, L, D, N]
        drive = (dt * xs)[..., None] * b[:, :, None, :]
        state = x.new_zeros(x.shape[0], self.inner, self.n)
        ys = []
        for t in range(length):
            state = decay[:, t] * state + drive[:, t]
            ys.append((state * c[:, t, None, :]).sum(-1))
        y = torch.stack(ys, dim=1) + xs * self.d
        return x + self.out_proj(y * F.silu(z))
