"""Cost tables from measured per-layer profiles (`cost=file`).

A profile lists, for every layer in model order, the measured forward time and either the full
backward time or its input- and weight-gradient parts, in milliseconds per micro-batch; it may
also give per-layer memory and message bytes and a label per layer. Two file formats hold it.

CSV (`.csv`): optional `# key: value` header lines for the metadata (name, source, seq_len,
micro_batch_size, hidden, label_kinds as `M=mamba2;-=mlp`), then one header row and one row per
layer::

    # name: my-model
    # hidden: 4096
    label,f_ms,b_ms,act_bytes,static_bytes,out_bytes
    M+E,3.35,8.76,1.2e9,2.0e9,3.3e7
    -,1.92,3.48,0.8e9,1.0e9,3.3e7

Columns: `f_ms` (required); `b_ms`, or `i_ms` and `w_ms` (one of the two is required; with all
three, b must equal i + w); `label`; `act_bytes` (activation bytes a layer keeps from F to its
backward), `w_act_bytes` (the part of `act_bytes` the weight-gradient pass W still needs after the
input-gradient pass I: zero-bubble's memory model has F allocate `act_bytes`, I free all but
`w_act_bytes`, W free those; at most `act_bytes`, and only with it; absent: 0, so I frees all),
`static_bytes` (parameter + gradient + optimizer bytes), `out_bytes` (bytes the layer sends to
the next one); a `layer` column, if present, must count 0, 1, 2, ...

JSON (`.json`): an object with the same metadata keys and either `"layers": [{"label": ...,
"f_ms": ..., "b_ms": ...}, ...]` (a record per layer) or column arrays `"f_ms": [...]`,
`"b_ms": [...]`, `"labels": [...]` (`"arch"` is accepted for labels, as the OctoPipe authors'
profile file names it).

Labels name a layer's type. A composite label such as `M+E` (a Mamba layer with the embedding
folded in) or `-+H` (an MLP with the LM head folded in) says the measured time is the sum of its
parts. `averaging=type` applies the OctoPipe authors' tool's rule (PipelineSimulator): every layer's time becomes
the mean of its type's measured times; a part that never appears alone is inferred from the
composites by subtraction (`E = t(M+E) - mean(M)`), and a composite's time is the sum of its
parts' means. A composite whose parts cannot all be inferred keeps its measured time.
`averaging=raw` keeps every layer's measured time.

When only the full backward is known, the schedule's split backward uses I = split·B and
W = (1 - split)·B; `split=0.5` is the authors' convention (I = W = B/2). `tick_ms` rounds every
F and full B up to a multiple of the tick (the authors' simulator counts in 0.1 ms ticks); the
split is taken from the rounded B, so F + B totals stay those of the rounded profile.

The profile defines the layers: `model_from_profile` builds the ModelSpec it describes, so that
`cost=file` needs no model preset with the same layer count.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from octopipe.config.convert import check, convert
from octopipe.config.cost import FileCost
from octopipe.cost.profile_format import (
    DEFAULT_LABEL_KINDS,
    Profile,
    load_preset,
    profile_presets,
    read_profile,
)
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.spec import ModelSpec

# ---------------------------------------------------------------------------------------------
# Reading and checking






















# ---------------------------------------------------------------------------------------------
# Presets






# ---------------------------------------------------------------------------------------------
# Averaging, rounding, splitting


def label_parts(label: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in label.split("+"))


def type_means(times: np.ndarray, labels: Sequence[str]) -> dict[str, float]:
    """Mean time per label part: pure layers first, then parts inferred from composites.

    A composite with exactly one part of unknown mean yields a sample of that part (its time
    minus the known parts' means); inference repeats until no new part can be found.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for t, lab in zip(times, labels):
        parts = label_parts(lab)
        if len(parts) == 1:
            sums[parts[0]] = sums.get(parts[0], 0.0) + float(t)
            counts[parts[0]] = counts.get(parts[0], 0) + 1
    means = {p: sums[p] / counts[p] for p in sums}
    while True:
        sums, counts = {}, {}
        for t, lab in zip(times, labels):
            unknown = [p for p in label_parts(lab) if p not in means]
            if len(unknown) == 1:
                known = sum(means[p] for p in label_parts(lab) if p in means)
                sums[unknown[0]] = sums.get(unknown[0], 0.0) + float(t) - known
                counts[unknown[0]] = counts.get(unknown[0], 0) + 1
        if not sums:
            return means
        means.update({p: sums[p] / counts[p] for p in sums})


def type_average(times: np.ndarray, labels: Sequence[str], what: str = "time") -> np.ndarray:
    """Each layer's time as the sum of its label parts' means (measured time where unknown)."""
    means = type_means(times, labels)
    out = np.array([sum(means[p] for p in label_parts(lab))
                    if all(p in means for p in label_parts(lab)) else float(t)
                    for t, lab in zip(times, labels)])
    bad = np.flatnonzero(out < 0)
    if bad.size:
        j = int(bad[0])
        raise ConfigError(f"type-averaged {what} of layer {j} ({labels[j]!r}) is {out[j]:g} ms < 0: "
                          f"its inferred parts exceed its measurement; use cost.averaging=raw")
    return out


def ceil_to_tick(times: np.ndarray, tick_ms: float | None) -> np.ndarray:
    """Round up to a multiple of `tick_ms` (None or 0: unchanged), robust to float noise."""
    if not tick_ms:
        return times
    return np.ceil(np.round(times / tick_ms, 9)) * tick_ms


@dataclass(frozen=True)
class ProfileOptions:
    """How a profile becomes costs: averaging (`raw`|`type`), backward split, tick rounding.

    `round_split` rounds I and W each up to the tick (instead of the full B), as the authors'
    tool does for its split-backward (ZB-H) baseline; B = I + W may then exceed the rounded B.
    """

    averaging: str = FileCost.averaging     # defaults and ranges: octopipe.config.cost.FileCost
    split: float = FileCost.split
    tick_ms: float | None = FileCost.tick_ms
    round_split: bool = FileCost.round_split

    def __post_init__(self) -> None:
        check(FileCost(averaging=self.averaging, split=self.split, tick_ms=self.tick_ms,
                       round_split=self.round_split), "cost.")

    @classmethod
    def of(cls, cost: FileCost) -> ProfileOptions:
        """The options of a typed `cost=file` section."""
        return cls(cost.averaging, cost.split, cost.tick_ms, cost.round_split)


def profile_times(profile: Profile, opts: ProfileOptions) -> dict[str, np.ndarray]:
    """Per-layer F, I, W (ms) after averaging, rounding and splitting, plus the full B."""
    if opts.averaging == "type" and profile.labels is None:
        raise ConfigError(f"cost.averaging=type needs layer labels, but profile {profile.name!r} "
                          f"is unlabelled; add a label column or set cost.averaging=raw")

    def prep(times: np.ndarray, what: str) -> np.ndarray:
        if opts.averaging == "type":
            times = type_average(times, profile.labels, what)
        return ceil_to_tick(times, opts.tick_ms)

    f = prep(profile.f_ms, "f_ms")
    if profile.b_ms is not None and opts.round_split:
        i = prep(profile.b_ms * opts.split, "b_ms")
        w = prep(profile.b_ms * (1.0 - opts.split), "b_ms")
        b = i + w
    elif profile.b_ms is not None:
        b = prep(profile.b_ms, "b_ms")
        i = b * opts.split
        w = b - i
    else:
        i = prep(profile.i_ms, "i_ms")
        w = prep(profile.w_ms, "w_ms")
        b = i + w
    return {"f": f, "i": i, "w": w, "b": b}


def describe(profile: Profile, opts: ProfileOptions) -> str:
    """One sentence saying how the profile's numbers become costs (averaging, split, rounding)."""
    avg = ("type-averaged (mean per layer type, composite parts inferred by subtraction)"
           if opts.averaging == "type" else "raw per-layer times")
    if profile.b_ms is None:
        split = "measured I and W"
    else:
        split = (f"full B measured, split assumed I = {opts.split:g}·B, W = {1 - opts.split:g}·B "
                 f"(cost.split)")
    tick = f"; rounded up to {opts.tick_ms:g} ms" if opts.tick_ms else ""
    if opts.tick_ms and opts.round_split and profile.b_ms is not None:
        tick += " (I and W rounded separately)"
    return f"{profile.name}: {profile.n_layers} layers, {avg}; {split}{tick}"


# ---------------------------------------------------------------------------------------------
# ModelSpec and CostTable


def layer_kind(label: str, label_kinds: Mapping[str, str]) -> LayerKind:
    """The kind of a labelled layer: its first part that is not the embedding or head, if any."""
    kinds = {**DEFAULT_LABEL_KINDS, **label_kinds}
    parts = label_parts(label)
    main = [p for p in parts if kinds.get(p) not in ("embedding", "head")] or list(parts)
    value = kinds.get(main[0])
    if value is None:
        raise ConfigError(f"layer label part {main[0]!r} has no layer kind; add it to the "
                          f"profile's label_kinds (e.g. {main[0]}=mlp)")
    return LayerKind(value)


def model_from_profile(profile: Profile) -> ModelSpec:
    """The ModelSpec a profile describes: one LayerSpec per profiled layer, named by its label.

    Shape fields other than `hidden` stay 0: the costs come from the measurements, not from
    shapes. Unlabelled layers are MLPs named `layerJ`.
    """
    labels = profile.labels or tuple(f"layer{j}" for j in range(profile.n_layers))
    layers = tuple(
        LayerSpec(kind=layer_kind(lab, profile.label_kinds) if profile.labels else LayerKind.MLP,
                  hidden=profile.hidden, name=lab)
        for lab in labels)
    return ModelSpec(name=profile.name, layers=layers, seq_len=profile.seq_len,
                     micro_batch_size=profile.micro_batch_size, source=profile.source)


def _message_bytes(profile: Profile, model: ModelSpec | None) -> np.ndarray:
    """Bytes a layer's output carries to the next one: measured, else the bf16 hidden state."""
    n = profile.n_layers
    if profile.out_bytes is not None:
        return profile.out_bytes
    if profile.hidden and profile.seq_len:
        return np.full(n, 2.0 * profile.hidden * profile.seq_len * profile.micro_batch_size)
    if model is not None and model.n_layers == n and model.seq_len:
        return np.array([2.0 * lay.hidden * model.tokens_per_microbatch for lay in model.layers])
    return np.zeros(n)


def profile_cost_table(profile: Profile, opts: ProfileOptions, kinds: Sequence[str] = ("dev",),
                       model: ModelSpec | None = None) -> CostTable:
    """The CostTable of a profile; every device kind gets the measured times (one GPU type)."""
    t = profile_times(profile, opts)
    k = len(kinds)
    n = profile.n_layers

    def cols(a: np.ndarray) -> np.ndarray:
        return np.repeat((a / 1e3)[:, None], k, axis=1)

    zeros = np.zeros(n)
    names = profile.labels or tuple(f"layer{j}" for j in range(n))
    tokens = profile.seq_len * profile.micro_batch_size
    if model is not None and model.n_layers == n:
        tokens = tokens or model.tokens_per_microbatch
    return CostTable(
        layer_names=tuple(names), kinds=tuple(kinds),
        f=cols(t["f"]), i=cols(t["i"]), w=cols(t["w"]),
        act_bytes=profile.act_bytes if profile.act_bytes is not None else zeros,
        static_bytes=profile.static_bytes if profile.static_bytes is not None else zeros,
        out_bytes=_message_bytes(profile, model), params=zeros,
        w_act_bytes=profile.w_act_bytes if profile.w_act_bytes is not None else zeros,
        tokens_per_microbatch=int(tokens))


def file_cost(cost: FileCost | Mapping[str, Any]) -> FileCost:
    """`cost` as a typed section (a raw mapping, e.g. from a test, goes through the schema)."""
    return cost if isinstance(cost, FileCost) else convert(FileCost, cost, "cost.")


def profile_of(cost: FileCost) -> Profile:
    """The profile named by `cost.path` or `cost.preset` (exactly one)."""
    cost = file_cost(cost)
    path, preset = cost.path, cost.preset
    if path and preset:
        raise ConfigError(f"cost.path={path!r} and cost.preset={preset!r} both given; choose one")
    if path:
        return read_profile(path)
    if preset:
        return load_preset(str(preset))
    raise ConfigError(f"cost=file needs cost.path=PATH (a .csv or .json profile) or "
                      f"cost.preset=NAME; presets: {', '.join(profile_presets())}")


def model_for_file_cost(cost: FileCost, model: ModelSpec | None) -> ModelSpec:
    """The ModelSpec to plan with under `cost=file`: `model` when its layer count matches the
    profile's, otherwise the profile's own layers (`model_from_profile`)."""
    profile = profile_of(cost)
    if model is not None and model.n_layers == profile.n_layers:
        return model
    return model_from_profile(profile)


def load_cost_file(cost: FileCost, model: ModelSpec | None, cluster: Any) -> CostTable:
    """`cost=file`: the CostTable of the configured profile on the cluster's device kinds.

    The profile defines the layers: when its layer count differs from `model`'s, the table
    follows the profile and `model_from_profile(profile_of(cost))` is the matching ModelSpec.
    """
    cost = file_cost(cost)
    kinds = tuple(k.name for k in cluster.kinds) if cluster is not None else ("dev",)
    return profile_cost_table(profile_of(cost), ProfileOptions.of(cost), kinds, model)
