"""Sub-layer splitting: one heavy layer as a chain of consecutive pieces a pipeline can split.

A pipeline cannot balance better than its heaviest layer: a 131k-vocabulary LM head is 7-12% of
an 8B model's work, more than a device's share at 16 or 32 stages. Five kinds split exactly into
a chain whose pieces pass a slightly wider tensor forward (and its gradient back):

- HEAD by vocabulary (the vocabulary-parallel head of Yeung et al. 2024, run as a chain): piece 0
  normalizes; each piece computes its logits slice and folds them into a running log-sum-exp and
  the target's logit; the last piece returns the loss. Carry: (norm output, lse, target logit),
  width `hidden + 2`.
- MLP by FFN width: piece 0 normalizes and adds its slice's output to the residual; each piece
  adds its slice's `down(act(up(n)))`. Carry: (residual sum, norm output), width `2·hidden`.
- MOE by experts: piece 0 normalizes, routes (the dense top-k gate vector over all experts) and
  runs the shared experts; each piece runs its experts on the tokens routed to them. Carry:
  (residual sum, norm output, gates), width `2·hidden + experts`.
- ATTENTION by key/value heads (as Megatron's tensor parallelism splits it, run as a chain): each
  piece holds whole GQA groups (its key/value heads and the query heads that share them) and its
  columns of the output projection; piece 0 normalizes, and each piece adds its heads' share of
  the output to the residual. Carry: (residual sum, norm output), width `2·hidden`. Layers with
  QK-norm do not split (its weights are shared by every head).
- MAMBA2 by groups: each piece holds `ssm_heads / ssm_groups` heads per group with their group's
  B and C, their conv channels, and their columns of the output projection; the gated norm is
  per group (as Mamba-2's `RMSNormGated` with `group_size = d_inner / ngroups`), so no piece
  needs another's heads. Carry: (residual sum, norm output), width `2·hidden`.

Piece j of k covers `[n·j//k, n·(j+1)//k)` of the split dimension (vocab, ffn, experts,
key/value heads or groups), so the pieces' parameters add up to the layer's. Splitting is a
planner decision, not a preset field.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.spec import ModelSpec

SPLIT_DIM: dict[LayerKind, str] = {LayerKind.HEAD: "vocab", LayerKind.MLP: "ffn",
                                   LayerKind.MOE: "experts", LayerKind.ATTENTION: "kv_heads",
                                   LayerKind.MAMBA2: "ssm_groups"}


def split_extent(x: LayerSpec) -> int:
    """Size of `x`'s split dimension: the most pieces it can have (1: it does not split)."""
    if x.kind not in SPLIT_DIM:
        return 1
    if x.kind is LayerKind.ATTENTION:
        return 1 if x.qk_norm else (x.kv_heads or x.heads)
    return max(int(getattr(x, SPLIT_DIM[x.kind])), 1)


def splittable(x: LayerSpec) -> bool:
    return split_extent(x) > 1 and x.pieces == 1


def piece_span(x: LayerSpec) -> tuple[int, int]:
    """[lo, hi) of the split dimension that piece `x.piece` of `x.pieces` holds."""
    n = split_extent(x)
    return n * x.piece // x.pieces, n * (x.piece + 1) // x.pieces


def is_first(x: LayerSpec) -> bool:
    return x.piece == 0


def is_last(x: LayerSpec) -> bool:
    return x.piece == x.pieces - 1


def carry_width(x: LayerSpec) -> int:
    """Width per token of what a piece that is not the last hands to the next piece."""
    if x.kind is LayerKind.HEAD:
        return x.hidden + 2
    if x.kind in (LayerKind.MLP, LayerKind.ATTENTION, LayerKind.MAMBA2):
        return 2 * x.hidden
    if x.kind is LayerKind.MOE:
        return 2 * x.hidden + x.experts
    raise ValueError(f"{x.kind.value} layers do not split")


def split_layer(x: LayerSpec, k: int) -> tuple[LayerSpec, ...]:
    """`x` as `k` consecutive pieces (k = 1 returns it unchanged)."""
    if k == 1:
        return (x,)
    if not splittable(x):
        why = " (its QK-norm weights are shared by every head)" if x.qk_norm else ""
        raise ConfigError(f"layer {x.label} ({x.kind.value}) cannot be split{why}; splittable kinds: "
                          f"{', '.join(k.value for k in SPLIT_DIM)}")
    n = split_extent(x)
    if not 1 <= k <= n:
        raise ConfigError(f"layer {x.label}: {k} pieces; its {SPLIT_DIM[x.kind]}={n} allows 1 to {n}")
    return tuple(replace(x, name=f"{x.label}[{j}/{k}]", piece=j, pieces=k) for j in range(k))


def split_model(model: ModelSpec, counts: Mapping[int, int]) -> ModelSpec:
    """`model` with layer i split into `counts[i]` pieces (layers not named stay whole)."""
    for i in counts:
        if not 0 <= int(i) < model.n_layers:
            raise ConfigError(f"pieces: layer {i} does not exist (the model has {model.n_layers} layers)")
    layers: list[LayerSpec] = []
    for i, x in enumerate(model.layers):
        layers.extend(split_layer(x, int(counts.get(i, 1))))
    return replace(model, layers=tuple(layers))


def piece_map(n_layers: int, counts: Mapping[int, int]) -> np.ndarray:
    """`out[j]` = the original layer that layer j of the split model came from."""
    return np.repeat(np.arange(n_layers), [int(counts.get(i, 1)) for i in range(n_layers)])


def choose_counts(work: Sequence[float], may_split: Sequence[bool], n_devices: int,
                  max_share: float = 0.5, max_pieces: Sequence[int] | None = None) -> dict[int, int]:
    """Pieces per layer so that no splittable layer exceeds `max_share` of a device's even share.

    `work[i]`: layer i's F+I+W time; `may_split[i]`: whether it may split; `max_pieces[i]`: the
    size of its split dimension. Returns only the layers that split (empty: nothing to gain).
    """
    w = np.asarray(work, dtype=float)
    if n_devices < 1 or not max_share > 0:
        raise ConfigError(f"choose_counts: n_devices={n_devices}, max_share={max_share}: both must be positive")
    cap = max_share * w.sum() / n_devices
    out: dict[int, int] = {}
    for i, (wi, ok) in enumerate(zip(w, may_split)):
        if ok and cap > 0 and wi > cap:
            k = math.ceil(wi / cap)
            if max_pieces is not None:
                k = min(k, int(max_pieces[i]))
            if k > 1:
                out[i] = k
    return out
