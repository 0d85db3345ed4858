"""CostTable: per layer × device kind F/I/W seconds, plus per-layer memory and message bytes.

Prefix sums make any stage's total an O(1) lookup, which the ILP, simulator and tuner rely on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from octopipe.cluster import Cluster
from octopipe.errors import ConfigError


def _prefix(a: np.ndarray) -> np.ndarray:
    z = np.zeros((1,) + a.shape[1:], dtype=np.float64)
    return np.concatenate([z, np.cumsum(a, axis=0, dtype=np.float64)], axis=0)


@dataclass(frozen=True, eq=False)
class CostTable:
    """Arrays indexed [layer] or [layer, kind]; `kinds` names the device kinds (columns).

    f, i, w: forward, input-gradient and weight-gradient seconds per micro-batch.
    full_b: seconds of a full backward (one autograd pass for both gradients), where measured:
    often below i + w, which pay for the split; None means b = i + w.
    action_s: host seconds every compute action (F, I, W or B) of a stage costs beyond its layers'
    seconds (the runtime's own work per action, which layers timed alone do not show); a stage's
    action of any number of layers pays it once.
    act_bytes: activation bytes a layer keeps from F until its backward frees them (per
    micro-batch); w_act_bytes: the part of them still held after I until W.
    static_bytes: parameter + gradient + optimizer bytes. out_bytes: bytes the layer's output
    sends to the next layer (a stage boundary after this layer). params: parameter counts.
    """

    layer_names: tuple[str, ...]
    kinds: tuple[str, ...]
    f: np.ndarray
    i: np.ndarray
    w: np.ndarray
    act_bytes: np.ndarray
    static_bytes: np.ndarray
    out_bytes: np.ndarray
    params: np.ndarray
    w_act_bytes: np.ndarray | None = None
    flops: np.ndarray | None = None          # forward FLOPs per micro-batch, per layer
    tokens_per_microbatch: int = 0
    full_b: np.ndarray | None = None
    action_s: float = 0.0
    _prefix: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.layer_names)
        for name in ("f", "i", "w", "full_b"):
            if name == "full_b" and self.full_b is None:
                continue
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.ndim == 1:
                arr = arr[:, None]
            if arr.shape != (n, len(self.kinds)):
                raise ValueError(f"CostTable.{name} has shape {arr.shape}, expected {(n, len(self.kinds))}")
            object.__setattr__(self, name, arr)
        for name in ("act_bytes", "static_bytes", "out_bytes", "params", "w_act_bytes", "flops"):
            val = getattr(self, name)
            if val is None:
                if name == "w_act_bytes":
                    val = np.zeros(n)
                else:
                    continue
            arr = np.asarray(val, dtype=np.float64)
            if arr.shape != (n,):
                raise ValueError(f"CostTable.{name} has shape {arr.shape}, expected {(n,)}")
            object.__setattr__(self, name, arr)

    @property
    def n_layers(self) -> int:
        return len(self.layer_names)

    @property
    def b(self) -> np.ndarray:
        """[layer, kind] seconds of a full backward: `full_b` where measured, else i + w."""
        return self.i + self.w if self.full_b is None else self.full_b

    @property
    def own_b(self) -> bool:
        """Whether a full backward is priced on its own (a measured B, or a host time per action
        that a B pays once) rather than as I + W to the bit."""
        return self.full_b is not None or self.action_s != 0.0

    @property
    def work(self) -> np.ndarray:
        """[layer, kind] F + I + W seconds (what a stage's load adds up)."""
        return self.f + self.i + self.w

    def kind_index(self, kind_name: str) -> int:
        return self.kinds.index(kind_name)

    def columns_for(self, cluster: Cluster, n_devices: int | None = None) -> tuple[int, ...]:
        """The column of each pipeline rank's device kind (matched by name; one column serves all)."""
        cols = []
        for d in range(cluster.n_devices if n_devices is None else n_devices):
            name = cluster.kind_of(d).name
            if name in self.kinds:
                cols.append(self.kinds.index(name))
            elif len(self.kinds) == 1:
                cols.append(0)
            else:
                raise ConfigError(f"the cost table has no column for device kind {name!r} of rank {d} "
                                  f"(columns: {', '.join(self.kinds)}); build the costs for this cluster")
        return tuple(cols)

    def prefix(self, name: str) -> np.ndarray:
        """Prefix sums of array `name` (f, i, w, work, act_bytes, ...) over layers: row j sums
        layers [0, j). Computed once; every stage sum in the project is a difference of two rows."""
        if name not in self._prefix:
            p = _prefix(getattr(self, name))
            p.setflags(write=False)
            self._prefix[name] = p
        return self._prefix[name]

    def range_sums(self, name: str, lo: np.ndarray, hi: np.ndarray,
                   kind: np.ndarray | int | None = None) -> np.ndarray:
        """Sums of array `name` over layers [lo[s], hi[s]), on column `kind[s]` where 2-D."""
        p = self.prefix(name)
        if p.ndim == 2:
            k = 0 if kind is None else kind
            return p[hi, k] - p[lo, k]
        return p[hi] - p[lo]

    def range_sum(self, name: str, lo: int, hi: int, kind: int | None = None) -> float:
        """Sum of array `name` over layers [lo, hi), on device-kind column `kind` where 2-D."""
        return float(self.range_sums(name, lo, hi, kind or 0))

    @classmethod
    def uniform(cls, n_layers: int, f: float = 1.0, i: float = 1.0, w: float = 1.0,
                act_bytes: float = 1.0, static_bytes: float = 0.0, out_bytes: float = 0.0,
                kinds: tuple[str, ...] = ("dev",)) -> CostTable:
        """Equal layers on identical devices: the oracle case for closed-form tests."""
        k = len(kinds)
        return cls(tuple(f"layer{j}" for j in range(n_layers)), kinds,
                   np.full((n_layers, k), f), np.full((n_layers, k), i), np.full((n_layers, k), w),
                   np.full(n_layers, act_bytes), np.full(n_layers, static_bytes),
                   np.full(n_layers, out_bytes), np.zeros(n_layers))
