"""The layouts of a training run: (tp, pp, dp, micro-batch size, micro-batch count) with
tp·pp·dp = the GPUs and dp·micro-batch size·count = the global batch, tp dividing every
tensor-parallel dimension of the model (attention and KV heads, FFN widths, SSM heads, MoE
experts) and fitting a node, pp at most the layers. Bad requests are one-line ConfigErrors that
say what would work."""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from octopipe.config.layout import LayoutConfig
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec


@dataclass(frozen=True, order=True)
class Layout:
    """One way to lay a run out on tp·pp·dp GPUs."""

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    microbatches: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        return (f"tp{self.tp} pp{self.pp} dp{self.dp} mbs{self.micro_batch_size} "
                f"m{self.microbatches}")


def tp_dimensions(model: ModelSpec) -> dict[str, int]:
    """The sizes tensor parallelism splits, by name (the largest common requirement per name)."""
    dims: dict[str, set[int]] = {}

    def add(name: str, value: int) -> None:
        if value > 0:
            dims.setdefault(name, set()).add(int(value))
    for x in model.layers:
        k = x.kind
        if k in (LayerKind.ATTENTION, LayerKind.VIT_BLOCK, LayerKind.LINEAR_ATTENTION, LayerKind.MLA):
            add("attention heads", x.heads)
            add("KV heads", x.kv_heads if k is not LayerKind.MLA else 0)
        if k in (LayerKind.MLP, LayerKind.VIT_BLOCK, LayerKind.PROJECTOR):
            add("FFN width", x.ffn)
        if k in (LayerKind.MAMBA2, LayerKind.MAMBA1):
            add("SSM heads", x.ssm_heads if k is LayerKind.MAMBA2 else x.ssm_heads * x.ssm_head_dim)
        if k is LayerKind.MOE:
            add("experts (expert parallelism over the TP group)", x.experts)
            add("shared-expert FFN width", x.shared_ffn)
    return {name: _gcd(vals) for name, vals in dims.items()}


def _gcd(values: set[int]) -> int:
    out = 0
    for v in values:
        out = gcd(out, v)
    return out


def valid_tp(model: ModelSpec, limit: int) -> list[int]:
    """TP degrees up to `limit` that divide every tensor-parallel dimension of `model`."""
    dims = tp_dimensions(model)
    return [t for t in range(1, limit + 1) if all(v % t == 0 for v in dims.values())]


def check_pinned_tp(model: ModelSpec, tp: int, gpus_per_node: int, across_nodes: bool) -> None:
    """A pinned layout.tp must divide the model's TP dimensions and fit a node (unless asked)."""
    if tp > gpus_per_node and not across_nodes:
        raise ConfigError(f"layout.tp={tp} exceeds a node ({gpus_per_node} GPUs): TP across "
                          f"nodes runs on the inter-node link; set layout.tp <= {gpus_per_node} "
                          "or layout.tp_across_nodes=true")
    bad = [f"{name} ({v})" for name, v in tp_dimensions(model).items() if v % tp]
    if bad:
        ok = ", ".join(str(t) for t in valid_tp(model, max(gpus_per_node, tp)))
        raise ConfigError(f"layout.tp={tp} does not divide the model's {', '.join(bad)}; "
                          f"valid tp: {ok}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(model: ModelSpec, n_gpus: int, gpus_per_node: int,
                      cfg: LayoutConfig) -> list[Layout]:
    """Every feasible layout, in a fixed order; ConfigError (one line, what would work) if none."""
    if cfg.tp is not None:
        check_pinned_tp(model, cfg.tp, gpus_per_node, cfg.tp_across_nodes)
    limit = n_gpus if cfg.tp_across_nodes else min(n_gpus, gpus_per_node)
    tps = [cfg.tp] if cfg.tp is not None else valid_tp(model, limit)
    grids = [(tp, pp, n_gpus // (tp * pp)) for tp in tps for pp in _divisors(n_gpus // tp)
             if n_gpus % tp == 0 and pp <= model.n_layers
             and (cfg.pp is None or pp == cfg.pp) and (cfg.dp is None or n_gpus // (tp * pp) == cfg.dp)]
    if not grids:
        pins = ", ".join(f"layout.{k}={v}" for k, v in (("tp", cfg.tp), ("pp", cfg.pp), ("dp", cfg.dp))
                         if v is not None)
        raise ConfigError(f"{n_gpus} GPUs: no tp x pp x dp factorizes them{' with ' + pins if pins else ''} "
                          f"(tp in {tps} dividing the model's heads and fitting a node, pp <= "
                          f"{model.n_layers} layers); choose a GPU count divisible by one of {tps}"
                          f"{' or other pins' if pins else ''}")
    out = []
    for tp, pp, dp in grids:
        if cfg.global_batch % dp:
            continue
        per_replica = cfg.global_batch // dp
        for b in cfg.micro_batch_sizes:
            if per_replica % b == 0:
                out.append(Layout(tp, pp, dp, b, per_replica // b))
    if not out:
        dps = sorted({dp for _, _, dp in grids})
        raise ConfigError(f"layout.global_batch={cfg.global_batch}: no layout divides it "
                          f"(dp in {dps}, micro-batch sizes {list(cfg.micro_batch_sizes)}); "
                          f"use a multiple of {min(dps) * min(cfg.micro_batch_sizes)} or pin "
                          "layout.dp to a divisor of the global batch")
    return sorted(set(out))
