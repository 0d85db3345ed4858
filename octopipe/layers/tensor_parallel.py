"""Megatron-style tensor-parallel variants of the attention, MLP, MoE and head layers.

Each is built from the whole layer the single-process model builds (`build_layer`, same seed)
and keeps rank `t`'s shard of it: column-parallel projections in (attention's query/key/value
heads, the MLP's up/gate columns, whole experts of an MoE), row-parallel projections out
(attention's output rows, the MLP's down columns), one all-reduce per block; the head is
vocabulary-parallel with a distributed cross-entropy (global max and log-sum-exp and the target
logit by all-reduce). Norms, routers and every other layer kind are replicated: each TP rank
computes them whole. `copy_to` (identity forward, all-reduce of the gradient backward) and
`reduce_from` (all-reduce forward, identity backward) are the two collectives; they take a
process group, so the same modules run on gloo (CPU) and NCCL.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from octopipe.layers.attention import Attention, sdpa
from octopipe.layers.edges import Head
from octopipe.layers.mlp import MLP, FeedForward, MoE, top_k_route
from octopipe.model.layer import LayerKind, LayerSpec

TP_KINDS = (LayerKind.ATTENTION, LayerKind.MLP, LayerKind.MOE, LayerKind.HEAD)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


def copy_to(x: torch.Tensor, group) -> torch.Tensor:
    """Enter a tensor-parallel region: the same `x` on every rank, gradients summed."""
    return _Copy.apply(x, group)


def reduce_from(x: torch.Tensor, group) -> torch.Tensor:
    """Leave it: the ranks' partial results summed, the gradient passed to each unchanged."""
    return _Reduce.apply(x, group)


def tp_problem(spec: LayerSpec, tp: int, vocab: int) -> str | None:
    """Why `spec` cannot be split `tp` ways (the field and its size), or None."""
    if tp == 1 or spec.kind not in TP_KINDS:
        return None
    sizes = {LayerKind.ATTENTION: (("heads", spec.heads), ("kv_heads", spec.kv_heads or spec.heads)),
             LayerKind.MLP: (("ffn", spec.ffn),),
             LayerKind.MOE: (("experts", spec.experts),
                             ("shared_ffn", spec.shared_experts * (spec.shared_ffn or spec.expert_ffn))),
             LayerKind.HEAD: (("vocab", spec.vocab or vocab),)}[spec.kind]
    for name, n in sizes:
        if n % tp:
            return f"tp={tp} does not divide {spec.label}'s {name}={n}"
    return None


def _rows(w: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    n = w.shape[0] // tp
    return w[t * n:(t + 1) * n].clone()


def _cols(w: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    n = w.shape[1] // tp
    return w[:, t * n:(t + 1) * n].clone()


def shard_ffn(ff: FeedForward, t: int, tp: int) -> FeedForward:
    """Rank t's columns of `ff`'s up (and gate) projection and the matching rows of its down
    projection (no bias on a sharded down projection: the caller adds the whole bias once)."""
    width = ff.down.in_features
    d_in, d_out = ff.up.in_features, ff.down.out_features
    part = FeedForward(d_in, width // tp, d_out, ff.activation, bias=False)
    with torch.no_grad():
        if ff.activation == "swiglu":
            gate, up = ff.up.weight.chunk(2, dim=0)
            part.up.weight.copy_(torch.cat([_rows(gate, t, tp), _rows(up, t, tp)]))
        else:
            part.up.weight.copy_(_rows(ff.up.weight, t, tp))
        part.down.weight.copy_(_cols(ff.down.weight, t, tp))
    if ff.up.bias is not None:
        b = ff.up.bias.detach()
        if ff.activation == "swiglu":
            g, u = b.chunk(2)
            b = torch.cat([_rows(g, t, tp), _rows(u, t, tp)])
        else:
            b = _rows(b, t, tp)
        part.up.bias = nn.Parameter(b.clone())
    return part


class TPMLP(nn.Module):
    def __init__(self, whole: MLP, t: int, tp: int, group) -> None:
        super().__init__()
        self.group, self.norm = group, whole.norm
        self.ffn = shard_ffn(whole.ffn, t, tp)
        self.bias = whole.ffn.down.bias

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        y = reduce_from(self.ffn(copy_to(self.norm(x), self.group)), self.group)
        return x + (y if self.bias is None else y + self.bias)


class TPAttention(nn.Module):
    """Rank t's query heads and the key/value heads they read; output rows summed."""

    def __init__(self, whole: Attention, t: int, tp: int, group) -> None:
        super().__init__()
        self.group, self.norm, self.qk_norm = group, whole.norm, whole.qk_norm
        self.heads, self.kv, self.hd = whole.heads // tp, whole.kv // tp, whole.hd
        self.causal, self.window = whole.causal, whole.window
        hidden = whole.o.out_features
        bias = whole.q.bias is not None
        self.q = nn.Linear(hidden, self.heads * self.hd, bias=bias)
        self.kv_proj = nn.Linear(hidden, 2 * self.kv * self.hd, bias=bias)
        self.o = nn.Linear(self.heads * self.hd, hidden, bias=False)
        self.o_bias = whole.o.bias
        with torch.no_grad():
            self.q.weight.copy_(_rows(whole.q.weight, t, tp))
            k, v = whole.kv_proj.weight.view(2, whole.kv * whole.hd, hidden).unbind(0)
            self.kv_proj.weight.copy_(torch.cat([_rows(k, t, tp), _rows(v, t, tp)]))
            self.o.weight.copy_(_cols(whole.o.weight, t, tp))
            if bias:
                self.q.bias.copy_(_rows(whole.q.bias, t, tp))
                kb, vb = whole.kv_proj.bias.view(2, -1).unbind(0)
                self.kv_proj.bias.copy_(torch.cat([_rows(kb, t, tp), _rows(vb, t, tp)]))

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        y = copy_to(self.norm(x), self.group)
        b, s, _ = y.shape
        q = self.q(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv_proj(y).view(b, s, 2, self.kv, self.hd).unbind(2)
        if self.qk_norm is not None:
            # the norms' weights are shared by all heads: their gradient is summed over the ranks
            nq, nk = self.qk_norm
            q = F.rms_norm(q, (self.hd,), copy_to(nq.weight, self.group), nq.eps)
            k = F.rms_norm(k, (self.hd,), copy_to(nk.weight, self.group), nk.eps)
        z = sdpa(q, k.transpose(1, 2), v.transpose(1, 2), self.causal, self.window)
        out = reduce_from(self.o(z.transpose(1, 2).reshape(b, s, -1)), self.group)
        return x + (out if self.o_bias is None else out + self.o_bias)


class TPMoE(nn.Module):
    """Whole experts per rank (experts/tp each), the shared experts column/row split; the router
    is replicated and weighs the summed expert outputs, so its gradient is whole on every rank."""

    def __init__(self, whole: MoE, t: int, tp: int, group) -> None:
        super().__init__()
        self.group, self.norm, self.router, self.top_k = group, whole.norm, whole.router, whole.top_k
        n = len(whole.experts) // tp
        self.first = t * n
        self.experts = nn.ModuleList(whole.experts[t * n:(t + 1) * n])
        self.shared = shard_ffn(whole.shared, t, tp) if whole.shared is not None else None

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        flat = self.norm(x).reshape(-1, x.shape[-1])
        weight, chosen = top_k_route(self.router(flat), self.top_k)
        mine = copy_to(flat, self.group)
        contrib = torch.zeros(*chosen.shape, flat.shape[-1], dtype=flat.dtype, device=flat.device)
        for e, expert in enumerate(self.experts, start=self.first):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                contrib = contrib.index_put((token, slot), expert(mine[token]))
        if self.shared is not None:
            shared = self.shared(mine)
            both = reduce_from(torch.cat([contrib.reshape(len(flat), -1), shared], dim=1), self.group)
            contrib, shared = both[:, :-flat.shape[-1]].view_as(contrib), both[:, -flat.shape[-1]:]
        else:
            contrib, shared = reduce_from(contrib, self.group), 0.0
        out = (contrib * weight[..., None]).sum(1) + shared
        return x + out.view_as(x)


class TPHead(nn.Module):
    """Vocabulary-parallel LM head: rank t holds vocab rows [t V/tp, (t+1) V/tp); the
    cross-entropy takes the global max, log-sum-exp and target logit by all-reduce."""

    def __init__(self, whole: Head, t: int, tp: int, group) -> None:
        super().__init__()
        self.group, self.norm = group, whole.norm
        v = whole.proj.out_features
        self.lo, self.hi = t * v // tp, (t + 1) * v // tp
        self.proj = nn.Linear(whole.proj.in_features, self.hi - self.lo, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(whole.proj.weight[self.lo:self.hi])

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        targets = batch["targets"].reshape(-1)
        y = copy_to(self.norm(x[:, -batch["targets"].shape[1]:]), self.group)
        logits = self.proj(y).reshape(len(targets), -1).float()
        top = logits.detach().max(dim=1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        sumexp = reduce_from(torch.exp(logits - top[:, None]).sum(dim=1), self.group)
        local = (targets >= self.lo) & (targets < self.hi)
        idx = torch.where(local, targets - self.lo, torch.zeros_like(targets))
        picked = logits.gather(1, idx[:, None]).squeeze(1) * local
        target = reduce_from(picked, self.group)
        return (torch.log(sumexp) + top - target).mean()


def tp_layer(whole: nn.Module, spec: LayerSpec, t: int, tp: int, group) -> nn.Module:
    """Rank t's tensor-parallel variant of `whole` (layer `spec`), or `whole` itself (replicated)."""
    if tp == 1 or spec.pieces > 1:
        return whole
    kind = {LayerKind.ATTENTION: TPAttention, LayerKind.MLP: TPMLP, LayerKind.MOE: TPMoE,
            LayerKind.HEAD: TPHead}.get(spec.kind)
    return whole if kind is None else kind(whole, t, tp, group)


def shard_grads(whole: nn.Module, spec: LayerSpec, t: int, tp: int) -> dict[str, torch.Tensor]:
    """The slices of `whole`'s gradients that rank t's variant holds, by the variant's names:
    the oracle a TP run is checked against."""
    view = copy.deepcopy(whole)
    with torch.no_grad():
        for p, q in zip(whole.parameters(), view.parameters()):
            q.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    return {n: p.detach() for n, p in tp_layer(view, spec, t, tp, None).named_parameters()}


def shard_index(whole: nn.Module, spec: LayerSpec, t: int, tp: int) -> dict[str, tuple[str, torch.Tensor]]:
    """Where rank t's variant of `whole` sits in it: per parameter of the variant (by its name),
    the whole layer's parameter it slices and the flat positions it holds there. Found by sharding
    a float64 copy of `whole` whose parameters hold their own positions, so it follows
    `tp_layer` whatever it cuts (a replicated parameter maps onto all of its positions)."""
    view = copy.deepcopy(whole).double()
    names, offsets, total = [], [], 0
    with torch.no_grad():
        for name, p in view.named_parameters():
            p.copy_(torch.arange(total, total + p.numel(), dtype=torch.float64).view_as(p))
            names.append(name)
            offsets.append(total)
            total += p.numel()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)   # the variant's fresh linears must hold positions exactly
    try:
        part = tp_layer(view, spec, t, tp, None)
    finally:
        torch.set_default_dtype(before)
    starts = torch.tensor(offsets, dtype=torch.int64)
    out = {}
    for name, q in part.named_parameters():
        pos = q.detach().reshape(-1).long()
        k = int(torch.searchsorted(starts, pos[:1], right=True)[0]) - 1
        local = pos - offsets[k]
        size = dict(view.named_parameters())[names[k]].numel()
        if local.numel() and (int(local.min()) < 0 or int(local.max()) >= size):
            raise ValueError(f"{spec.label}: {name} spans several parameters of the whole layer")
        out[name] = (names[k], local)
    return out
