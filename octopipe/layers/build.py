"""LayerSpec → module, with seeded initialization, and the shape each layer passes on."""
from __future__ import annotations

import torch
from torch import nn

from octopipe.layers.attention import MLA, Attention, LinearAttention
from octopipe.layers.edges import Embedding, Head, PatchEmbed, Projector, ViTBlock
from octopipe.layers.mlp import MLP, MoE
from octopipe.layers.pieces import build_piece, load_pieces, origins, whole_spec
from octopipe.layers.ssm import Mamba1, Mamba2
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.pieces import carry_width, is_last
from octopipe.model.spec import ModelSpec

_SPEC_ONLY: dict[LayerKind, type[nn.Module]] = {
    LayerKind.ATTENTION: Attention, LayerKind.MLA: MLA, LayerKind.LINEAR_ATTENTION: LinearAttention,
    LayerKind.MAMBA2: Mamba2, LayerKind.MAMBA1: Mamba1, LayerKind.MLP: MLP, LayerKind.MOE: MoE,
    LayerKind.VIT_BLOCK: ViTBlock,
}  # kinds whose module needs only its LayerSpec


def _tokens(model: ModelSpec, spec: LayerSpec) -> int:
    return spec.tokens or model.seq_len


def _module(model: ModelSpec, spec: LayerSpec, prev: LayerSpec | None) -> nn.Module:
    k = spec.kind
    if k in _SPEC_ONLY:
        return _SPEC_ONLY[k](spec)
    if k in (LayerKind.EMBEDDING, LayerKind.HEAD):
        return (Embedding if k is LayerKind.EMBEDDING else Head)(spec, model.vocab)
    if k is LayerKind.PATCH_EMBED:
        return PatchEmbed(spec, _tokens(model, spec))
    if k is LayerKind.PROJECTOR:
        return Projector(spec, prev.hidden if prev is not None else spec.in_hidden)
    raise ValueError(f"layer {spec.label}: no runtime module for kind {spec.kind}")


def build_layer(model: ModelSpec, index: int, seed: int = 0) -> nn.Module:
    """Layer `index` of `model`, initialized from (seed, index) alone, so that any process that
    builds it (a pipeline rank or the single-process reference) gets the same weights.

    A piece of a split layer (`octopipe.model.pieces`) holds its slice of the whole layer as the
    unsplit model builds it, and every layer is seeded by its index in the unsplit model: a
    split model starts from the same weights, so it computes the same losses and gradients."""
    spec = model.layers[index]
    origin = origins(model)[index]
    prev = model.layers[index - 1] if index > 0 else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1_000_003 + origin)
        whole = _module(model, whole_spec(spec) if spec.pieces > 1 else spec, prev)
    if spec.pieces == 1:
        return whole
    piece = build_piece(spec)
    load_pieces(whole, [piece])
    return piece


def carry_shape(model: ModelSpec, index: int) -> tuple[int, ...]:
    """Shape of the tensor layer `index` hands to layer `index + 1` (() for the loss; a piece of a
    split layer that is not the last hands on its carry, a head piece only the text positions)."""
    b = model.micro_batch_size
    tokens, width = 0, 0
    for j in range(index + 1):
        spec = model.layers[j]
        k = spec.kind
        if k is LayerKind.PATCH_EMBED:
            tokens, width = _tokens(model, spec), spec.hidden
        elif k is LayerKind.PROJECTOR:
            tokens, width = tokens * width // (spec.in_hidden or width), spec.hidden
        elif k is LayerKind.EMBEDDING:
            tokens, width = tokens + model.seq_len, spec.hidden
        elif k is LayerKind.HEAD and is_last(spec):
            return ()
        else:
            width = spec.hidden
        if j == index and not is_last(spec):           # a piece hands on its carry
            return (b, model.seq_len if k is LayerKind.HEAD else tokens, carry_width(spec))
    return (b, tokens, width)
