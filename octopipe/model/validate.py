"""Checks that a LayerSpec or ModelSpec describes a model that can exist.

Each failure is a ConfigError whose message names the field (prefixed by where it came from,
e.g. `model.blocks.*`) and says what would be valid, so the CLI can print it as one line.
"""
from __future__ import annotations

from dataclasses import fields

from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.pieces import SPLIT_DIM, split_extent
from octopipe.model.spec import ModelSpec

ACTIVATIONS = ("swiglu", "gelu", "relu2")

# Fields each kind needs to be positive; every other integer field only needs to be >= 0.
REQUIRED: dict[LayerKind, tuple[str, ...]] = {
    LayerKind.EMBEDDING: ("vocab",),
    LayerKind.HEAD: ("vocab",),
    LayerKind.ATTENTION: ("heads", "kv_heads", "head_dim"),
    LayerKind.MLA: ("heads", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"),
    LayerKind.LINEAR_ATTENTION: ("heads", "head_dim"),
    LayerKind.MAMBA2: ("ssm_heads", "ssm_head_dim", "ssm_state", "ssm_groups", "conv_kernel",
                       "ssm_chunk"),
    LayerKind.MAMBA1: ("ssm_heads", "ssm_head_dim", "ssm_state", "conv_kernel", "dt_rank"),
    LayerKind.MLP: ("ffn",),
    LayerKind.MOE: ("experts", "top_k", "expert_ffn"),
    LayerKind.PATCH_EMBED: ("patch", "channels", "temporal_patch", "tokens"),
    LayerKind.VIT_BLOCK: ("heads", "head_dim", "ffn", "tokens"),
    LayerKind.PROJECTOR: ("in_hidden", "ffn", "tokens"),
}


def _fail(where: str, name: str, value, why: str) -> None:
    raise ConfigError(f"{where}.{name}={value}: {why}")


def validate_layer(x: LayerSpec, where: str = "layer") -> LayerSpec:
    """Return `x` unchanged when valid; otherwise raise ConfigError naming `where.field`."""
    if not isinstance(x.kind, LayerKind):
        raise ConfigError(f"{where}.kind={x.kind!r}: valid kinds: "
                          f"{', '.join(k.value for k in LayerKind)}")
    for f in fields(x):
        v = getattr(x, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            _fail(where, f.name, v, "must not be negative")
    if x.hidden <= 0:
        _fail(where, "hidden", x.hidden, "must be a positive width")
    for name in REQUIRED[x.kind]:
        if getattr(x, name) <= 0:
            _fail(where, name, getattr(x, name), f"a {x.kind.value} layer needs it positive")
    k = x.kind
    if k is LayerKind.ATTENTION and x.heads % x.kv_heads:
        _fail(where, "kv_heads", x.kv_heads,
              f"must divide heads={x.heads} (each KV head serves a whole group of query heads)")
    if k in (LayerKind.MLP, LayerKind.MOE, LayerKind.VIT_BLOCK) and x.activation not in ACTIVATIONS:
        _fail(where, "activation", repr(x.activation), f"valid: {', '.join(ACTIVATIONS)}")
    if k is LayerKind.MOE:
        if x.top_k > x.experts:
            _fail(where, "top_k", x.top_k, f"cannot exceed experts={x.experts}")
        if x.shared_experts and x.shared_ffn <= 0:
            _fail(where, "shared_ffn", x.shared_ffn,
                  f"must be positive when shared_experts={x.shared_experts}")
    if x.pieces < 1 or x.piece >= x.pieces:
        _fail(where, "piece", x.piece, f"must be in [0, pieces={x.pieces}) with pieces >= 1")
    if x.pieces > 1:
        if k not in SPLIT_DIM:
            _fail(where, "pieces", x.pieces, f"{k.value} layers do not split; splittable: "
                  f"{', '.join(d.value for d in SPLIT_DIM)}")
        if x.pieces > split_extent(x):
            _fail(where, "pieces", x.pieces, f"exceeds {SPLIT_DIM[k]}={split_extent(x)}"
                  + (" (QK-norm attention does not split)" if x.qk_norm else ""))
    if k is LayerKind.MAMBA2 and x.ssm_heads % x.ssm_groups:
        _fail(where, "ssm_groups", x.ssm_groups, f"must divide ssm_heads={x.ssm_heads}")
    return x


def validate_model(spec: ModelSpec, where: str = "model") -> ModelSpec:
    """Check the training shape and every layer; the embedding and head must agree on vocab."""
    if spec.seq_len <= 0:
        _fail(where, "seq_len", spec.seq_len, "must be a positive number of tokens")
    if spec.micro_batch_size <= 0:
        _fail(where, "micro_batch_size", spec.micro_batch_size, "must be at least 1")
    if not spec.layers:
        raise ConfigError(f"{where}.layers: the model has no layers")
    for i, x in enumerate(spec.layers):
        validate_layer(x, f"{where}.layers[{i}]({x.label})")
        if x.kind in (LayerKind.EMBEDDING, LayerKind.HEAD) and spec.vocab and x.vocab != spec.vocab:
            _fail(f"{where}.layers[{i}]", "vocab", x.vocab, f"differs from model vocab={spec.vocab}")
    return spec
