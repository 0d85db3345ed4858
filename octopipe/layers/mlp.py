"""Dense feed-forward layers (SwiGLU, GELU, ReLU²) and mixture-of-experts with shared experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.model.layer import LayerSpec


class FeedForward(nn.Module):
    """`activation` = swiglu (gated), gelu or relu2 (squared ReLU, Nemotron-H)."""

    def __init__(self, d_in: int, ffn: int, d_out: int, activation: str, bias: bool = False) -> None:
        super().__init__()
        if activation not in ("swiglu", "gelu", "relu2"):
            raise ValueError(f"activation {activation!r}: expected swiglu, gelu or relu2")
        self.activation = activation
        self.up = nn.Linear(d_in, (2 if activation == "swiglu" else 1) * ffn, bias=bias)
        self.down = nn.Linear(ffn, d_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.activation == "gelu":
            h = F.gelu(h)
        else:
            h = F.relu(h).square()
        return self.down(h)


class MLP(nn.Module):
    """Pre-norm residual dense MLP."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(spec.hidden)
        self.ffn = FeedForward(spec.hidden, spec.ffn, spec.hidden, spec.activation, spec.bias)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        return x + self.ffn(self.norm(x))


def top_k_route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax router → the k chosen experts per token and their renormalized weights."""
    weight, chosen = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return weight / weight.sum(-1, keepdim=True), chosen


class MoE(nn.Module):
    """Pre-norm residual MoE: softmax router, top-k experts (weights renormalized), plus
    always-on shared experts. Tokens are gathered per expert, so compute scales with top_k."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.top_k = spec.top_k
        self.norm = nn.RMSNorm(spec.hidden)
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(spec.hidden, spec.expert_ffn, spec.hidden, spec.activation)
                                     for _ in range(spec.experts))
        shared = spec.shared_experts * (spec.shared_ffn or spec.expert_ffn)
        self.shared = FeedForward(spec.hidden, shared, spec.hidden, spec.activation) if shared else None

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        y = self.norm(x)
        flat = y.reshape(-1, y.shape[-1])
        weight, chosen = top_k_route(self.router(flat), self.top_k)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, expert(flat[token]) * weight[token, slot, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        return x + out.view_as(x)
