"""Pieces of a split layer (`octopipe.model.pieces`) as modules, and the weight map between a
whole layer and its pieces.

A piece that is not the last returns the carry `piece.carry_width` wide; the next piece unpacks
it, so the pipeline sends one tensor between pieces as between layers and autograd carries the
gradient back through it: the chain computes the whole layer's output (or loss) and every
gradient, only the order of some floating-point additions differs.

- HeadPiece: piece 0 normalizes the last seq_len positions; each piece folds its vocabulary
  slice's logits into a running log-sum-exp and picks the target's logit when the target lies in
  its slice; the last returns mean(lse - target logit), the cross-entropy of `io.Head`.
- MLPPiece: piece 0 normalizes and adds its FFN slice to the residual (with the down projection's
  bias); the others add theirs.
- MoEPiece: piece 0 normalizes, routes (softmax over all experts, renormalized top-k, scattered
  into a dense gate vector) and runs the shared experts; each piece runs its experts on the tokens
  whose gate for them is set, weighted by it.
- AttentionPiece: piece 0 normalizes; each piece attends with its key/value heads and their
  query heads and adds its columns of the output projection to the residual (piece 0 the bias).
- Mamba2Piece: piece 0 normalizes; each piece runs the Mamba-2 mixer of its groups (their heads,
  B and C, conv channels, per-head scalars and gated-norm weights) and adds its columns of the
  output projection to the residual.

Weights: `piece_source` says where each piece parameter lives in the whole layer, `load_pieces`
copies a whole layer into its pieces and `pieces_state_dict` converts a whole model's state (or
gradients) to the names of its split form.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import nn

from octopipe.errors import ConfigError
from octopipe.layers.attention import Attention
from octopipe.layers.mlp import FeedForward, top_k_route
from octopipe.layers.ssm import Mamba2
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.pieces import is_first, is_last, piece_span
from octopipe.model.spec import ModelSpec


def _mark(piece: nn.Module, spec: LayerSpec) -> None:
    """Record on `piece` which piece of its layer it is: `spec`, its span [lo, hi), first, last."""
    if spec.pieces < 2:
        raise ValueError(f"layer {spec.label}: pieces={spec.pieces}; a piece needs pieces >= 2")
    piece.spec = spec
    piece.lo, piece.hi = piece_span(spec)
    piece.first, piece.last = is_first(spec), is_last(spec)


class _Piece(nn.Module):
    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        _mark(self, spec)


class HeadPiece(_Piece):
    """Vocabulary slice [lo, hi) of the LM head; carry (norm output, lse, target logit)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__(spec)
        self.norm = nn.RMSNorm(spec.hidden) if self.first else None
        self.proj = nn.Linear(spec.hidden, self.hi - self.lo, bias=False)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        targets = batch["targets"]
        h = self.spec.hidden
        if self.first:
            n = self.norm(x[:, -targets.shape[1]:])
        else:
            n, lse, picked = x[..., :h], x[..., h].float(), x[..., h + 1].float()
        logits = self.proj(n).float()
        inside = (targets >= self.lo) & (targets < self.hi)
        local = (targets - self.lo).clamp(0, self.hi - self.lo - 1)
        mine = torch.where(inside, logits.gather(-1, local[..., None]).squeeze(-1), 0.0)
        part = torch.logsumexp(logits, dim=-1)
        if self.first:
            lse, picked = part, mine
        else:
            lse, picked = torch.logaddexp(lse, part), picked + mine
        if self.last:
            return (lse - picked).mean()
        return torch.cat([n, lse[..., None].to(n.dtype), picked[..., None].to(n.dtype)], dim=-1)


class MLPPiece(_Piece):
    """FFN columns [lo, hi) of a pre-norm residual MLP; carry (residual sum, norm output)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__(spec)
        f = self.hi - self.lo
        self.norm = nn.RMSNorm(spec.hidden) if self.first else None
        self.ffn = FeedForward(spec.hidden, f, spec.hidden, spec.activation, spec.bias)
        if spec.bias and not self.first:        # the down projection's bias is added once, by piece 0
            self.ffn.down = nn.Linear(f, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        h = self.spec.hidden
        if self.first:
            n = self.norm(x)
            r = x + self.ffn(n)
        else:
            r, n = x[..., :h], x[..., h:]
            r = r + self.ffn(n)
        return r if self.last else torch.cat([r, n], dim=-1)


class MoEPiece(_Piece):
    """Experts [lo, hi) of a pre-norm residual MoE; carry (residual sum, norm output, gates)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__(spec)
        self.top_k = spec.top_k
        self.norm = nn.RMSNorm(spec.hidden) if self.first else None
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False) if self.first else None
        self.experts = nn.ModuleList(FeedForward(spec.hidden, spec.expert_ffn, spec.hidden, spec.activation)
                                     for _ in range(self.lo, self.hi))
        shared = spec.shared_experts * (spec.shared_ffn or spec.expert_ffn)
        self.shared = FeedForward(spec.hidden, shared, spec.hidden, spec.activation) \
            if shared and self.first else None

    def _route(self, flat: torch.Tensor) -> torch.Tensor:
        logits = self.router(flat)
        weight, chosen = top_k_route(logits, self.top_k)
        return torch.zeros_like(logits).scatter(1, chosen, weight)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        h, n_exp = self.spec.hidden, self.spec.experts
        if self.first:
            r, n = x, self.norm(x)
            gates = self._route(n.reshape(-1, h))
        else:
            r, n, gates = x[..., :h], x[..., h:2 * h], x[..., 2 * h:].reshape(-1, n_exp)
        flat = n.reshape(-1, h)
        out = torch.zeros_like(flat)
        for e, expert in zip(range(self.lo, self.hi), self.experts):
            token = gates[:, e].nonzero(as_tuple=True)[0]
            if token.numel():
                out = out.index_add(0, token, expert(flat[token]) * gates[token, e, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        r = r + out.view_as(r)
        return r if self.last else torch.cat([r, n, gates.view(*r.shape[:-1], n_exp)], dim=-1)


class _MixerPiece:
    """A residual mixer's piece (attention heads, Mamba-2 groups): piece 0 normalizes, each adds
    its `mix` of the norm output to the residual; carry (residual sum, norm output)."""

    spec: LayerSpec
    first: bool
    last: bool
    norm: nn.Module | None

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        h = self.spec.hidden
        if self.first:
            r, n = x, self.norm(x)
        else:
            r, n = x[..., :h], x[..., h:]
        r = r + self.mix(n)
        return r if self.last else torch.cat([r, n], dim=-1)


class AttentionPiece(_MixerPiece, Attention):
    """Key/value heads [lo, hi) of a pre-norm residual attention layer, with their query heads."""

    def __init__(self, spec: LayerSpec) -> None:
        lo, hi = piece_span(spec)
        Attention.__init__(self, spec, kv_heads=hi - lo, norm=is_first(spec), o_bias=is_first(spec))
        _mark(self, spec)


class Mamba2Piece(_MixerPiece, Mamba2):
    """Groups [lo, hi) of a pre-norm residual Mamba-2 layer, with their heads."""

    def __init__(self, spec: LayerSpec) -> None:
        lo, hi = piece_span(spec)
        Mamba2.__init__(self, spec, groups=hi - lo, norm=is_first(spec))
        _mark(self, spec)


PIECES: dict[LayerKind, type[nn.Module]] = {LayerKind.HEAD: HeadPiece, LayerKind.MLP: MLPPiece,
                                            LayerKind.MOE: MoEPiece, LayerKind.ATTENTION: AttentionPiece,
                                            LayerKind.MAMBA2: Mamba2Piece}


def build_piece(spec: LayerSpec) -> nn.Module:
    """The module of piece `spec.piece` of `spec.pieces` (freshly initialized; see `load_pieces`)."""
    if spec.kind not in PIECES:
        raise ValueError(f"layer {spec.label}: {spec.kind.value} layers do not split")
    return PIECES[spec.kind](spec)


def whole_spec(spec: LayerSpec) -> LayerSpec:
    """The shape of the layer a piece was cut from."""
    return replace(spec, piece=0, pieces=1)


class Source(NamedTuple):
    """Where a piece's parameter lives in the whole layer: that parameter's `name`, and (`dim`,
    `index`, `size`) = the indices along `dim`, whose whole size is `size` (None: all of it)."""

    name: str
    dim: int = 0
    index: torch.Tensor | None = None
    size: int = 0


def piece_source(spec: LayerSpec, name: str) -> Source:
    """Where parameter `name` of piece `spec` lives in the whole layer."""
    lo, hi = piece_span(spec)
    span = torch.arange(lo, hi)
    if spec.kind is LayerKind.HEAD and name == "proj.weight":
        return Source(name, 0, span, spec.vocab)
    if spec.kind is LayerKind.MLP and name.startswith("ffn.up."):
        if spec.activation == "swiglu":            # gate rows, then up rows (FeedForward's chunk(2))
            return Source(name, 0, torch.cat([span, span + spec.ffn]), 2 * spec.ffn)
        return Source(name, 0, span, spec.ffn)
    if spec.kind is LayerKind.MLP and name == "ffn.down.weight":
        return Source(name, 1, span, spec.ffn)
    if spec.kind is LayerKind.MOE and name.startswith("experts."):
        _, i, rest = name.split(".", 2)
        return Source(f"experts.{lo + int(i)}.{rest}")
    if spec.kind is LayerKind.ATTENTION:
        return _attention_source(spec, name, lo, hi)
    if spec.kind is LayerKind.MAMBA2:
        return _mamba2_source(spec, name, lo, hi)
    return Source(name)


def _attention_source(spec: LayerSpec, name: str, lo: int, hi: int) -> Source:
    """Key/value heads [lo, hi): their query rows, key and value rows, output columns."""
    hd, kv = spec.head_dim or spec.hidden // spec.heads, spec.kv_heads or spec.heads
    rep = spec.heads // kv
    q = torch.arange(lo * rep * hd, hi * rep * hd)
    k = torch.arange(lo * hd, hi * hd)
    if name in ("q.weight", "q.bias"):
        return Source(name, 0, q, spec.heads * hd)
    if name in ("kv_proj.weight", "kv_proj.bias"):
        return Source(name, 0, torch.cat([k, k + kv * hd]), 2 * kv * hd)
    if name == "o.weight":
        return Source(name, 1, q, spec.heads * hd)
    return Source(name)


def _mamba2_source(spec: LayerSpec, name: str, lo: int, hi: int) -> Source:
    """Groups [lo, hi): their heads' z, x and dt rows and B, C rows of the in-projection, their
    conv channels, per-head scalars, gated-norm weights and output columns."""
    r, p, n = spec.ssm_heads // spec.ssm_groups, spec.ssm_head_dim, spec.ssm_state
    inner, gn = spec.ssm_heads * p, spec.ssm_groups * n
    chans = torch.arange(lo * r * p, hi * r * p)
    states = torch.arange(lo * n, hi * n)
    heads = torch.arange(lo * r, hi * r)
    conv = torch.cat([chans, inner + states, inner + gn + states])   # x, B, C of the conv input
    if name == "in_proj.weight":
        return Source(name, 0, torch.cat([chans, inner + conv, 2 * inner + 2 * gn + heads]),
                      2 * inner + 2 * gn + spec.ssm_heads)
    if name in ("conv.weight", "conv.bias"):
        return Source(name, 0, conv, inner + 2 * gn)
    if name in ("dt_bias", "a_log", "d"):
        return Source(name, 0, heads, spec.ssm_heads)
    if name == "out_norm.weight":
        return Source(name, 0, chans, inner)
    if name == "out_proj.weight":
        return Source(name, 1, chans, inner)
    return Source(name)


def piece_tensors(spec: LayerSpec, names: Sequence[str], whole: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The slices of the whole layer's tensors `whole` (weights or their gradients, by the whole
    layer's parameter names) that piece `spec`'s parameters `names` hold."""
    out = {}
    for name in names:
        src = piece_source(spec, name)
        if src.name not in whole:
            raise KeyError(f"piece {spec.label}: parameter {name} comes from {src.name}, "
                           "absent from the whole layer")
        t = whole[src.name]
        if src.index is None:
            out[name] = t
            continue
        if t.shape[src.dim] != src.size:
            raise ValueError(f"piece {spec.label}: {src.name} of the whole layer has shape {tuple(t.shape)}; "
                             f"dimension {src.dim} should be {src.size}")
        out[name] = t.index_select(src.dim, src.index.to(t.device))
    return out


@torch.no_grad()
def load_pieces(whole: nn.Module, pieces: Sequence[nn.Module]) -> None:
    """Copy a whole layer's weights into its pieces (`PIECES`): slices of the split dimension, and
    the norm, router, shared experts and down- (or output-) projection bias into piece 0."""
    src = dict(whole.named_parameters())
    for piece in pieces:
        params = dict(piece.named_parameters())
        for name, t in piece_tensors(piece.spec, list(params), src).items():
            if params[name].shape != t.shape:
                raise ValueError(f"piece {piece.spec.label}: {name} has shape {tuple(params[name].shape)} "
                                 f"but its slice of the whole layer has {tuple(t.shape)}")
            params[name].copy_(t)


def origins(model: ModelSpec) -> list[int]:
    """`out[j]` = the index, in the unsplit model, of the layer that layer j belongs to."""
    out, i = [], -1
    for x in model.layers:
        i += x.piece == 0
        out.append(i)
    return out


def pieces_state_dict(model: ModelSpec, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A whole model's tensors named `layers.<index>.<param>` (a StageModule's state or
    gradients) converted to the names and slices of the split `model` (`split_model`'s output)."""
    out: dict[str, torch.Tensor] = {}
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        head, index, rest = key.split(".", 2)
        if head != "layers":
            raise ConfigError(f"state key {key!r}: expected layers.<index>.<parameter>")
        by_layer.setdefault(int(index), {})[rest] = t
    for j, (x, o) in enumerate(zip(model.layers, origins(model))):
        whole = by_layer.get(o, {})
        if x.pieces == 1:
            out.update({f"layers.{j}.{k}": t for k, t in whole.items()})
            continue
        with torch.device("meta"):
            names = [n for n, _ in build_piece(x).named_parameters()]
        out.update({f"layers.{j}.{k}": t for k, t in piece_tensors(x, names, whole).items()})
    return out
