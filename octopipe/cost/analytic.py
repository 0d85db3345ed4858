"""Analytic cost model: FLOPs, bytes and memory of every layer kind → a roofline CostTable.

Formulas follow models-and-hardware.md §3 (a multiply-add counts 2 FLOPs; 16-bit activations):

- Forward FLOPs per token. Weight GEMMs: attention `2h(q + 2kv) + 2qh` (q = a·d, kv = g·d), SwiGLU
  `6hf`, GELU/ReLU² `4hf`, MoE `2hE + k·FFN(f_e) + n_shared·FFN(f_s)`, Mamba-2 in/out projections,
  Mamba-1 projections, lightning-attention projections, MLA (Megatron's form), LM head `2hV`.
  Cores without weights: softmax attention `4·q·s_eff` with s_eff = s/2 causal, min(window, s/2)
  sliding, s bidirectional; MLA `2a(d_nope + d_rope + d_v)·s_eff`; Mamba-2 scan `7·d_in·N`
  (Megatron); Mamba-1 scan `9·d_in·N`; lightning core `4·a·d²`.
- Backward: every weight GEMM costs its forward FLOPs once as input gradient (I) and once as
  weight gradient (W). Cores have no weights, so their backward is all I: 2.5× forward for flash
  attention (it recomputes the scores), 2× otherwise.
- Stored activations (bytes per token; Korthikanti et al. 2022 itemized, generalized to GQA,
  SwiGLU, MoE, Mamba): see `_activations`. A GPT block with dropout and no flash attention gives
  exactly `34·s·b·h + 5·a·s²·b`; with flash attention the `5as²b` term becomes the fp32
  log-sum-exp, `4·a·s·b`. `w_act_bytes` are the inputs of weight GEMMs, still needed by W after I
  (capped at the stored bytes: under full recomputation W reuses what I recomputed).
  Recomputation: `selective` drops the s² scores (and recomputes the attention core in I);
  `full` stores only the layer input and reruns the whole forward inside I.
- Parameter + gradient + optimizer bytes: `bytes_per_param` per parameter, 18 by default
  (Megatron's mixed-precision Adam: bf16 weight 2 + fp32 gradient 4 + fp32 master 4 + Adam m 4
  + v 4); 16 is ZeRO's accounting with 16-bit gradients.
- Time of a pass: `max(flops/(peak·eff), bytes/(bandwidth·eff))` per device kind, where bytes
  are the weights the pass reads (MoE: only the experts its tokens reach), the activations it
  writes or reads and, for W, the fp32 gradient accumulation.
- Tensor parallelism `tp` (with sequence parallelism) divides FLOPs, weights, stored
  activations and the bytes a boundary sends (Megatron's scatter/gather). Its collectives
  (`octopipe.cost.collectives.tp_collective_seconds`: all-reduces, or all-gather/reduce-scatter
  under `sequence_parallel`, the vocabulary-parallel head's reductions, MoE all-to-all) are timed
  on the TP group's link (`tp_link`: the cluster's intra-node link unless asked) and added to
  the F and I passes, or overlapped with them (`tp_overlap`); `tp_collectives=false` leaves them
  out.
- Data parallelism `dp` with ZeRO stage `zero`: static bytes per parameter become
  `octopipe.cost.collectives.static_bytes_per_param` (optimizer state / dp under ZeRO-1, and
  gradients / dp under ZeRO-2); the gradient synchronization itself is timed per stage by the
  simulator (`octopipe.sim.durations.GradSync`).
- Boundary bytes `out_bytes`: `tokens·width·2·b` of the layer's output (residual stream; the
  ViT width inside the vision encoder; image tokens × text width after the projector); 0 after
  the head, which ends in a scalar loss.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from octopipe.cluster import Cluster
from octopipe.config.convert import check, convert
from octopipe.config.cost import AnalyticCost
from octopipe.cost.collectives import PassComm, static_bytes_per_param, tp_collective_seconds, with_collectives
from octopipe.cost.table import CostTable
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.params import layer_params
from octopipe.model.pieces import carry_width, is_first, is_last, piece_span
from octopipe.model.spec import ModelSpec


@dataclass(frozen=True)
class LayerWork:
    """Device-independent work of one layer for one micro-batch (before tensor parallelism)."""

    gemm_flops: float        # forward FLOPs of weight GEMMs (= I's and W's GEMM FLOPs)
    core_flops: float        # forward FLOPs without weights (attention core, scans)
    core_bwd_flops: float    # backward FLOPs of the core, all input-gradient
    weight_bytes: float      # bf16 weights one pass reads
    act_bytes: float         # activations kept from F to the backward
    score_bytes: float       # the part of act_bytes that is s² attention scores (non-flash)
    w_act_bytes: float       # activations W still needs after I (weight-GEMM inputs)
    in_bytes: float          # the input the layer received (what full recomputation keeps)
    out_bytes: float         # bytes the layer's output sends to the next layer
    params: int
    input_grad: bool = True  # False where the input is data (token ids, pixels): no I pass

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.core_flops


@dataclass(frozen=True)
class AnalyticCostModel(AnalyticCost):
    """The analytic model with its settings (`cost=analytic`; fields, docs and defaults in
    octopipe.config.cost.AnalyticCost)."""

    def __post_init__(self) -> None:
        check(self, "cost.")

    @classmethod
    def of(cls, cost: AnalyticCost) -> AnalyticCostModel:
        """The model with the settings of a typed `cost` section (profiled costs included)."""
        return cls(**{f.name: getattr(cost, f.name) for f in fields(AnalyticCost)
                      if f.name != "source"})

    @classmethod
    def from_config(cls, cfg: Any) -> AnalyticCostModel:
        """From a raw `cost` mapping (a preset file read directly), through the schema."""
        return cls.of(convert(AnalyticCost, cfg, "cost."))

    # -- per-layer work --------------------------------------------------------------------

    def work(self, x: LayerSpec, model: ModelSpec) -> LayerWork:
        """FLOPs and bytes of layer `x` for one micro-batch of `model`."""
        b = model.micro_batch_size
        t = x.tokens or model.seq_len
        if x.kind is LayerKind.HEAD:
            t = model.seq_len
        if x.pieces > 1:
            return _piece_work(x, t, t * b, self.flash_attention)
        gemm, core, bwd_factor = _flops_per_token(x, t)
        act, scores, w_act = _activations(x, t, self.flash_attention, self.dropout)
        n_tok = t * b
        weights = 2.0 * _touched_params(x, n_tok)
        if x.kind is LayerKind.PROJECTOR:
            in_bytes = 2.0 * t * x.in_hidden * b
        elif x.kind in (LayerKind.EMBEDDING, LayerKind.PATCH_EMBED):
            in_bytes = act * n_tok                              # token ids or pixels
        else:
            in_bytes = 2.0 * t * x.hidden * b
        out = 0.0 if x.kind is LayerKind.HEAD else 2.0 * t * x.hidden * b
        return LayerWork(gemm_flops=gemm * n_tok, core_flops=core * n_tok,
                         core_bwd_flops=bwd_factor * core * n_tok, weight_bytes=weights,
                         act_bytes=act * n_tok, score_bytes=scores * n_tok,
                         w_act_bytes=w_act * n_tok, in_bytes=in_bytes, out_bytes=out,
                         params=layer_params(x),
                         input_grad=x.kind not in (LayerKind.EMBEDDING, LayerKind.PATCH_EMBED))

    def stored_activation_bytes(self, w: LayerWork) -> float:
        """Bytes kept from F to B under the recomputation setting (per GPU of the TP group)."""
        if self.recompute == "full":
            kept = w.in_bytes
        elif self.recompute == "selective":
            kept = w.act_bytes - w.score_bytes
        else:
            kept = w.act_bytes
        return kept / self.tp

    def pass_work(self, w: LayerWork) -> dict[str, tuple[float, float]]:
        """(FLOPs, bytes) per GPU of the F, I and W passes, recomputation included in I."""
        tp = self.tp
        f_flops = w.gemm_flops + w.core_flops
        f_bytes = w.weight_bytes + w.act_bytes + w.in_bytes + w.out_bytes
        i_flops = w.gemm_flops + w.core_bwd_flops
        i_bytes = w.weight_bytes + w.act_bytes + w.in_bytes + w.out_bytes
        if not w.input_grad:
            i_flops = i_bytes = 0.0
        elif self.recompute == "full":
            i_flops += f_flops
            i_bytes += f_bytes
        elif self.recompute == "selective" and w.score_bytes:
            i_flops += w.core_flops
        w_flops = w.gemm_flops
        # W reads the GEMM inputs and accumulates fp32 gradients (read + write) of touched weights.
        w_bytes = w.w_act_bytes + 4.0 * w.weight_bytes if w.weight_bytes else 0.0
        return {"f": (f_flops / tp, f_bytes / tp), "i": (i_flops / tp, i_bytes / tp),
                "w": (w_flops / tp, w_bytes / tp)}

    def tp_comm(self, x: LayerSpec, model: ModelSpec, cluster: Cluster) -> PassComm:
        """Seconds of layer `x`'s TP collectives per micro-batch in F and I (none at tp=1)."""
        if self.tp <= 1 or not self.tp_collectives:
            return PassComm()
        link = cluster.intra_link if self.tp_link == "intra" else cluster.inter_link
        t = model.seq_len if x.kind is LayerKind.HEAD else (x.tokens or model.seq_len)
        return tp_collective_seconds(x, t * model.micro_batch_size, self.tp, link,
                                     self.sequence_parallel, self.collective_algorithm)

    def static_per_param(self) -> float:
        """Parameter + gradient + optimizer bytes per parameter on one GPU (ZeRO over dp)."""
        if self.dp == 1 and self.zero == 0:
            return self.bytes_per_param
        return static_bytes_per_param(self.bytes_per_param, self.dp, self.zero, self.grad_bytes)

    def seconds(self, flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
        """Roofline time of one pass on one device."""
        return max(flops / (peak * self.efficiency), nbytes / (bandwidth * self.efficiency))

    # -- the table ---------------------------------------------------------------------------

    def table(self, model: ModelSpec, cluster: Cluster) -> CostTable:
        """CostTable with one column per device kind of `cluster`."""
        n, k = model.n_layers, len(cluster.kinds)
        f, i, wt = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k))
        act, w_act, static, out, params, flops = (np.zeros(n) for _ in range(6))
        for j, x in enumerate(model.layers):
            w = self.work(x, model)
            passes = self.pass_work(w)
            comm = self.tp_comm(x, model, cluster)
            i_comm = comm.i + (comm.f if self.recompute == "full" else 0.0) if w.input_grad else 0.0
            ov = self.tp_overlap
            for c, dev in enumerate(cluster.kinds):
                f[j, c] = with_collectives(
                    self.seconds(*passes["f"], dev.peak_flops, dev.memory_bandwidth), comm.f, ov)
                i[j, c] = with_collectives(
                    self.seconds(*passes["i"], dev.peak_flops, dev.memory_bandwidth), i_comm, ov)
                wt[j, c] = self.seconds(*passes["w"], dev.peak_flops, dev.memory_bandwidth)
            act[j] = self.stored_activation_bytes(w)
            w_act[j] = min(w.w_act_bytes / self.tp, act[j])
            static[j] = w.params * self.static_per_param() / self.tp
            out[j] = w.out_bytes / self.tp
            params[j] = w.params
            flops[j] = w.flops
        return CostTable(tuple(x.label for x in model.layers), tuple(d.name for d in cluster.kinds),
                         f, i, wt, act, static, out, params, w_act_bytes=w_act, flops=flops,
                         tokens_per_microbatch=model.tokens_per_microbatch)


def analytic_costs(cost: AnalyticCost, model: ModelSpec, cluster: Cluster) -> CostTable:
    """`cost.source=analytic`: the CostTable of `model` on `cluster`'s device kinds."""
    settings = cost if isinstance(cost, AnalyticCost) else convert(AnalyticCost, cost, "cost.")
    return AnalyticCostModel.of(settings).table(model, cluster)


# -- formulas -------------------------------------------------------------------------------


def _piece_work(x: LayerSpec, s: int, n_tok: int, flash: bool) -> LayerWork:
    """Work of one piece of a split layer (octopipe.model.pieces) at sequence `s`: the split
    dimension's GEMMs, cores and activations are divided; piece 0 keeps the norm (and the MoE
    router and shared experts); boundaries between pieces carry `carry_width` values per token."""
    h, first, last = x.hidden, is_first(x), is_last(x)
    lo, hi = piece_span(x)
    in_norm = 4.0 * h if first else 2.0 * h           # norm in + out, or the carried norm output
    core = bwd = scores = 0.0
    if x.kind is LayerKind.HEAD:
        gemm, act, w_act = 2.0 * h * (hi - lo), in_norm + 4.0 * (hi - lo), 2.0 * h
    elif x.kind is LayerKind.MLP:
        f = hi - lo
        gemm, act, w_act = _ffn_flops(h, f, x.activation), in_norm + _ffn_act(f, x.activation), 2.0 * h + 2.0 * f
    elif x.kind is LayerKind.ATTENTION:
        heads = (hi - lo) * (x.heads // x.kv_heads)
        q, kv = heads * x.head_dim, (hi - lo) * x.head_dim
        (gemm, core), bwd = _attention_flops(x, q, kv, s), 2.5
        base, scores = _attention_act(h, q, kv, heads, s, flash, False)
        act, w_act = base - 4.0 * h + in_norm, 2.0 * h + 2.0 * q
    elif x.kind is LayerKind.MAMBA2:
        dims = _mamba2_dims(x, hi - lo)
        (gemm, core), bwd = _mamba2_flops(x, *dims), 2.0
        act, w_act = _mamba2_act(in_norm, *dims), 2.0 * h + 2.0 * dims[1]
    else:
        share = x.top_k * (hi - lo) / x.experts          # expected routed tokens per token
        gemm = share * _ffn_flops(h, x.expert_ffn, x.activation)
        act = in_norm + share * (2.0 * h + _ffn_act(x.expert_ffn, x.activation))
        w_act = 2.0 * h + share * (2.0 * h + 2.0 * x.expert_ffn)
        if first:
            gemm += 2.0 * h * x.experts + x.shared_experts * _ffn_flops(h, x.shared_ffn, x.activation)
            act += x.shared_experts * _ffn_act(x.shared_ffn, x.activation)
            w_act += x.shared_experts * 2.0 * x.shared_ffn
    carry = 2.0 * carry_width(x) * n_tok
    out = 0.0 if (last and x.kind is LayerKind.HEAD) else (2.0 * h * n_tok if last else carry)
    return LayerWork(gemm_flops=gemm * n_tok, core_flops=core * n_tok, core_bwd_flops=bwd * core * n_tok,
                     weight_bytes=2.0 * layer_params(x), act_bytes=act * n_tok, score_bytes=scores * n_tok,
                     w_act_bytes=w_act * n_tok, in_bytes=2.0 * h * n_tok if first else carry,
                     out_bytes=out, params=layer_params(x))


def _ffn_flops(h: int, f: int, activation: str) -> float:
    return (6.0 if activation == "swiglu" else 4.0) * h * f


def _ffn_act(f: int, activation: str) -> float:
    """Bytes per token an FFN stores past its input: SwiGLU gate/up outputs + down input."""
    return (6.0 if activation == "swiglu" else 4.0) * f


def _s_eff(x: LayerSpec, s: int) -> float:
    """Keys each query attends to on average (Megatron's causal s/2 convention)."""
    if not x.causal:
        return float(s) if x.window <= 0 else float(min(x.window, s))
    if x.window > 0:
        return float(min(x.window, s / 2))
    return s / 2


def _flops_per_token(x: LayerSpec, s: int) -> tuple[float, float, float]:
    """(GEMM FLOPs, core FLOPs, core backward factor) per token of layer `x` at sequence s."""
    h, k = x.hidden, x.kind
    if k is LayerKind.EMBEDDING:
        return 0.0, 0.0, 0.0
    if k is LayerKind.HEAD:
        return 2.0 * h * x.vocab, 0.0, 0.0
    if k in (LayerKind.ATTENTION, LayerKind.VIT_BLOCK):
        q, kv = x.heads * x.head_dim, x.kv_heads * x.head_dim
        gemm, core = _attention_flops(x, q, kv, s)
        if k is LayerKind.VIT_BLOCK:
            gemm += _ffn_flops(h, x.ffn, x.activation)
        return gemm, core, 2.5
    if k is LayerKind.MLA:
        a, qk = x.heads, x.qk_nope_dim + x.qk_rope_dim
        q_path = (h * x.q_lora_rank + x.q_lora_rank * a * qk) if x.q_lora_rank else h * a * qk
        gemm = 2.0 * (q_path + h * (x.kv_lora_rank + x.qk_rope_dim)
                      + x.kv_lora_rank * a * (x.qk_nope_dim + x.v_head_dim) + a * x.v_head_dim * h)
        return gemm, 2.0 * a * (qk + x.v_head_dim) * _s_eff(x, s), 2.5
    if k is LayerKind.LINEAR_ATTENTION:
        q = x.heads * x.head_dim
        return 2.0 * h * 4 * q + 2.0 * q * h, 4.0 * x.heads * x.head_dim ** 2, 2.0
    if k is LayerKind.MAMBA2:
        return (*_mamba2_flops(x, *_mamba2_dims(x, x.ssm_groups)), 2.0)
    if k is LayerKind.MAMBA1:
        d_in, r, n = x.ssm_heads * x.ssm_head_dim, x.dt_rank, x.ssm_state
        gemm = 2.0 * h * 2 * d_in + 2.0 * d_in * (r + 2 * n) + 2.0 * r * d_in + 2.0 * d_in * h
        return gemm, 9.0 * d_in * n, 2.0
    if k is LayerKind.MLP:
        return _ffn_flops(h, x.ffn, x.activation), 0.0, 0.0
    if k is LayerKind.MOE:
        gemm = (2.0 * h * x.experts + x.top_k * _ffn_flops(h, x.expert_ffn, x.activation)
                + x.shared_experts * _ffn_flops(h, x.shared_ffn, x.activation))
        return gemm, 0.0, 0.0
    if k is LayerKind.PATCH_EMBED:
        return 2.0 * x.channels * x.temporal_patch * x.patch ** 2 * h, 0.0, 0.0
    if k is LayerKind.PROJECTOR:
        return 2.0 * x.in_hidden * x.ffn + 2.0 * x.ffn * h, 0.0, 0.0
    raise ValueError(f"no FLOP formula for layer kind {k}")


def _attention_flops(x: LayerSpec, q: int, kv: int, s: int) -> tuple[float, float]:
    """(GEMM, core) forward FLOPs per token of attention with `q` query and `kv` key/value
    channels (the whole layer's or a piece's): Q, K, V and output projections; scores and
    their product with V."""
    return 2.0 * x.hidden * (q + 2 * kv) + 2.0 * q * x.hidden, 4.0 * q * _s_eff(x, s)


def _mamba2_dims(x: LayerSpec, groups: int) -> tuple[int, int, int]:
    """(heads, inner width, B/C width) of `groups` of a Mamba-2 layer's groups."""
    heads = x.ssm_heads * groups // x.ssm_groups
    return heads, heads * x.ssm_head_dim, groups * x.ssm_state


def _mamba2_flops(x: LayerSpec, heads: int, d_in: int, gn: int) -> tuple[float, float]:
    """(GEMM, core) forward FLOPs per token of those Mamba-2 heads: in- and out-projection, SSD."""
    return 2.0 * x.hidden * (2 * d_in + 2 * gn + heads) + 2.0 * d_in * x.hidden, 7.0 * d_in * x.ssm_state


def _mamba2_act(in_norm: float, heads: int, d_in: int, gn: int) -> float:
    """Bytes per token those Mamba-2 heads store past the norm's `in_norm`: the in-projection's
    output and the gated-norm input."""
    return in_norm + 2.0 * (2 * d_in + 2 * gn + heads) + 2.0 * d_in


def _attention_act(h: int, q: int, kv: int, heads: int, s: int, flash: bool,
                   dropout: bool) -> tuple[float, float]:
    """(bytes per token, of which s² scores): norm in, QKV input, Q, K, V, output-proj input,
    plus the softmax statistics (flash: fp32 log-sum-exp) or scores (2·a·s; 5·a·s with dropout)."""
    base = 2 * h + 2 * h + 2 * q + 2 * kv + 2 * kv + 2 * q + (h if dropout else 0)
    if flash:
        return base + 4.0 * heads, 0.0
    scores = (5.0 if dropout else 2.0) * heads * s
    return base + scores, scores


def _activations(x: LayerSpec, s: int, flash: bool, dropout: bool) -> tuple[float, float, float]:
    """(stored bytes, s² score bytes, W's GEMM-input bytes) per token of layer `x`."""
    h, k = x.hidden, x.kind
    drop = h if dropout else 0
    if k is LayerKind.EMBEDDING:
        return 8.0, 0.0, 8.0                                  # int64 token ids
    if k is LayerKind.HEAD:
        return 4.0 * h + 4.0 * x.vocab, 0.0, 2.0 * h          # norm in/out, fp32 logits
    if k is LayerKind.ATTENTION:
        q, kv = x.heads * x.head_dim, x.kv_heads * x.head_dim
        act, scores = _attention_act(h, q, kv, x.heads, s, flash, dropout)
        return act, scores, 2.0 * h + 2.0 * q
    if k is LayerKind.VIT_BLOCK:
        q = x.heads * x.head_dim
        act, scores = _attention_act(h, q, q, x.heads, s, flash, dropout)
        mlp = 4.0 * h + _ffn_act(x.ffn, x.activation) + drop
        return act + mlp, scores, 2.0 * h + 2.0 * q + 2.0 * h + 2.0 * x.ffn
    if k is LayerKind.MLA:
        a, qk = x.heads, x.qk_nope_dim + x.qk_rope_dim
        q_lora = 4.0 * x.q_lora_rank                           # compressed q and its norm
        kv_c = 2.0 * (x.kv_lora_rank + x.qk_rope_dim) + 2.0 * x.kv_lora_rank
        qkv = 2.0 * a * qk * 2 + 2.0 * a * x.v_head_dim       # Q, K (expanded), V
        o = 2.0 * a * x.v_head_dim
        act = 4.0 * h + q_lora + kv_c + qkv + o + drop
        w_act = 2.0 * h + 2.0 * x.q_lora_rank + 2.0 * x.kv_lora_rank + o
        if flash:
            return act + 4.0 * a, 0.0, w_act
        scores = (5.0 if dropout else 2.0) * a * s
        return act + scores, scores, w_act
    if k is LayerKind.LINEAR_ATTENTION:
        q = x.heads * x.head_dim
        return 4.0 * h + 12.0 * q + drop, 0.0, 2.0 * h + 2.0 * q
    if k is LayerKind.MAMBA2:
        dims = _mamba2_dims(x, x.ssm_groups)
        return _mamba2_act(4.0 * h, *dims) + drop, 0.0, 2.0 * h + 2.0 * dims[1]
    if k is LayerKind.MAMBA1:
        d_in = x.ssm_heads * x.ssm_head_dim
        act = 4.0 * h + 10.0 * d_in + 2.0 * (x.dt_rank + 2 * x.ssm_state) + drop
        return act, 0.0, 2.0 * h + 4.0 * d_in + 2.0 * x.dt_rank
    if k is LayerKind.MLP:
        act = 4.0 * h + _ffn_act(x.ffn, x.activation) + drop
        return act, 0.0, 2.0 * h + 2.0 * x.ffn
    if k is LayerKind.MOE:
        act = (4.0 * h + x.top_k * (2.0 * h + _ffn_act(x.expert_ffn, x.activation))
               + x.shared_experts * _ffn_act(x.shared_ffn, x.activation) + drop)
        w_act = (2.0 * h + x.top_k * (2.0 * h + 2.0 * x.expert_ffn)
                 + x.shared_experts * 2.0 * x.shared_ffn)
        return act, 0.0, w_act
    if k is LayerKind.PATCH_EMBED:
        pix = 2.0 * x.channels * x.temporal_patch * x.patch ** 2
        return pix, 0.0, pix
    if k is LayerKind.PROJECTOR:
        return 2.0 * x.in_hidden + 4.0 * x.ffn, 0.0, 2.0 * x.in_hidden + 2.0 * x.ffn
    raise ValueError(f"no activation formula for layer kind {k}")


def _touched_params(x: LayerSpec, tokens: int) -> float:
    """Parameters one pass over `tokens` tokens reads: all of them, except that an embedding
    gathers only the rows it needs and an MoE only the experts its tokens are routed to."""
    if x.kind is LayerKind.EMBEDDING:
        return float(min(x.vocab, tokens) * x.hidden)
    if x.kind is LayerKind.MOE and x.experts:
        reached = min(x.experts, tokens * x.top_k)
        idle = (x.experts - reached) * (layer_params(x) - layer_params(x, active=True)) \
            / max(x.experts - x.top_k, 1)
        return float(layer_params(x) - idle)
    return float(layer_params(x))
