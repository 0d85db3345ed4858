"""Parameter counts per layer, from the shapes in a LayerSpec.

Every count includes the layer's own pre-norm (each sub-layer is a residual block with its own
norm, as in Nemotron-H; a Llama block is an attention layer plus an MLP layer). RMSNorm has `h`
weights; the ViT uses LayerNorm (`2h`). `active_params` counts what one token touches (MoE:
router, top-k routed and the shared experts), the "active" figure model cards quote.
"""
from __future__ import annotations

from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.pieces import piece_span
from octopipe.model.spec import ModelSpec


def _ffn_params(h: int, f: int, activation: str, bias: bool) -> int:
    """One FFN (or one expert): SwiGLU has gate, up and down matrices; GELU/ReLU² two."""
    if activation == "swiglu":
        return 3 * h * f + (2 * f + h if bias else 0)
    return 2 * h * f + (f + h if bias else 0)


def _attention_params(x: LayerSpec) -> int:
    return (_attention_heads_params(x, x.kv_heads) + (x.hidden if x.bias else 0)
            + (2 * x.head_dim if x.qk_norm else 0))


def _attention_heads_params(x: LayerSpec, kv_heads: int) -> int:
    """Q, K, V rows and output-projection columns of `kv_heads` key/value heads and their query
    heads (a piece's, or all of them; the output projection's bias and QK-norm are not counted)."""
    h = x.hidden
    q, kv = kv_heads * (x.heads // x.kv_heads) * x.head_dim, kv_heads * x.head_dim
    return h * q + 2 * h * kv + q * h + (q + 2 * kv if x.bias else 0)


def _mla_params(x: LayerSpec) -> int:
    h, a = x.hidden, x.heads
    qk = x.qk_nope_dim + x.qk_rope_dim
    if x.q_lora_rank:
        q = h * x.q_lora_rank + x.q_lora_rank + x.q_lora_rank * a * qk
    else:
        q = h * a * qk
    kv = h * (x.kv_lora_rank + x.qk_rope_dim) + x.kv_lora_rank \
        + x.kv_lora_rank * a * (x.qk_nope_dim + x.v_head_dim)
    return q + kv + a * x.v_head_dim * h


def _mamba2_params(x: LayerSpec, groups: int = 0) -> int:
    """In-projection rows, conv channels, dt_bias/A_log/D, gated-norm weights and output columns
    of `groups` of the layer's groups with their heads (default all of them)."""
    h, g = x.hidden, groups or x.ssm_groups
    H = x.ssm_heads * g // x.ssm_groups
    d_in, gn = H * x.ssm_head_dim, g * x.ssm_state
    conv_dim = d_in + 2 * gn
    in_proj = h * (2 * d_in + 2 * gn + H)
    conv = conv_dim * x.conv_kernel + conv_dim
    return in_proj + conv + 3 * H + d_in + d_in * h      # dt_bias, A_log, D; gated norm; out_proj


def _mamba1_params(x: LayerSpec) -> int:
    h, d_in, n, r = x.hidden, x.ssm_heads * x.ssm_head_dim, x.ssm_state, x.dt_rank
    return (h * 2 * d_in + d_in * x.conv_kernel + d_in + d_in * (r + 2 * n)
            + r * d_in + d_in + d_in * n + d_in + d_in * h)


def _linear_attention_params(x: LayerSpec) -> int:
    h, q = x.hidden, x.heads * x.head_dim
    return h * 3 * q + h * q + q * h + q        # QKV, output gate, output, norm on the heads


def _moe_params(x: LayerSpec, active: bool) -> int:
    h = x.hidden
    router = h * x.experts + (x.experts if x.bias else 0)
    routed = (x.top_k if active else x.experts) * _ffn_params(h, x.expert_ffn, x.activation, x.bias)
    shared = x.shared_experts * _ffn_params(h, x.shared_ffn, x.activation, x.bias)
    return router + routed + shared


def _vit_block_params(x: LayerSpec) -> int:
    h, q = x.hidden, x.heads * x.head_dim
    attn = 3 * h * q + q * h + (3 * q + h if x.bias else 0)
    return 2 * 2 * h + attn + _ffn_params(h, x.ffn, x.activation, x.bias)


def _piece_params(x: LayerSpec, active: bool) -> int:
    """Parameters of one piece of a split layer (octopipe.model.pieces): the norm, router, shared
    experts and the down (or output) projection's bias belong to piece 0; the split dimension is
    divided."""
    lo, hi = piece_span(x)
    h, first = x.hidden, x.piece == 0
    if x.kind is LayerKind.HEAD:
        return (h if first else 0) + h * (hi - lo)
    if x.kind is LayerKind.MLP:
        ffn = _ffn_params(h, hi - lo, x.activation, x.bias) - (h if x.bias else 0)
        return (h + (h if x.bias else 0) if first else 0) + ffn
    if x.kind is LayerKind.ATTENTION:
        return (h + (h if x.bias else 0) if first else 0) + _attention_heads_params(x, hi - lo)
    if x.kind is LayerKind.MAMBA2:
        return (h if first else 0) + _mamba2_params(x, hi - lo)
    if x.kind is LayerKind.MOE:
        one = _ffn_params(h, x.expert_ffn, x.activation, x.bias)
        routed = (x.top_k * (hi - lo) / x.experts if active else hi - lo) * one
        head = (h + h * x.experts + (x.experts if x.bias else 0)
                + x.shared_experts * _ffn_params(h, x.shared_ffn, x.activation, x.bias)) if first else 0
        return int(round(head + routed))
    raise ValueError(f"{x.kind.value} layers do not split")


def layer_params(x: LayerSpec, active: bool = False) -> int:
    """Parameters of one layer; `active=True` counts only what one token uses (MoE top-k)."""
    k, h = x.kind, x.hidden
    if x.pieces > 1:
        return _piece_params(x, active)
    if k is LayerKind.EMBEDDING:
        return x.vocab * h
    if k is LayerKind.HEAD:
        return h + h * x.vocab
    if k is LayerKind.ATTENTION:
        return h + _attention_params(x)
    if k is LayerKind.MLA:
        return h + _mla_params(x)
    if k is LayerKind.LINEAR_ATTENTION:
        return h + _linear_attention_params(x)
    if k is LayerKind.MAMBA2:
        return h + _mamba2_params(x)
    if k is LayerKind.MAMBA1:
        return h + _mamba1_params(x)
    if k is LayerKind.MLP:
        return h + _ffn_params(h, x.ffn, x.activation, x.bias)
    if k is LayerKind.MOE:
        return h + _moe_params(x, active)
    if k is LayerKind.PATCH_EMBED:
        return x.channels * x.temporal_patch * x.patch * x.patch * h + (h if x.bias else 0)
    if k is LayerKind.VIT_BLOCK:
        return _vit_block_params(x)
    if k is LayerKind.PROJECTOR:
        return _proj_params(x)
    raise ValueError(f"no parameter count for layer kind {k}")


def _proj_params(x: LayerSpec) -> int:
    """Two linear layers with biases: in_hidden → ffn → hidden (LLaVA, Qwen2-VL's merger)."""
    return x.in_hidden * x.ffn + x.ffn + x.ffn * x.hidden + x.hidden


def model_params(spec: ModelSpec, active: bool = False) -> int:
    return sum(layer_params(x, active) for x in spec.layers)
