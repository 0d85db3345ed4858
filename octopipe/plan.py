"""Partition (consecutive stages of layers) and Plan (partition, placement, table, pieces).

A `Partition` is one thing with three views: `sizes` (layers per stage), `bounds` (the S + 1
layer indices where stages start, ending with the layer count) and `ranges` (`(lo, hi)` per
stage, also what iterating it yields). The tuner's candidates, the solvers' results and plans
all hold one; `min_max_partition` is the one min-max linear-partition DP.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate

import numpy as np

from octopipe.errors import ConfigError, ScheduleError
from octopipe.model.pieces import split_model
from octopipe.model.spec import ModelSpec
from octopipe.schedule.table import ScheduleTable


@dataclass(frozen=True, eq=False)
class Partition:
    """Stage s holds layers `ranges[s] = (bounds[s], bounds[s+1])`; every stage is non-empty.

    Reads as the sequence of its ranges (`len`, indexing, iteration) and equals a Partition
    with the same sizes or a sequence of the same `(lo, hi)` ranges.
    """

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = tuple(int(n) for n in self.sizes)
        if not sizes or min(sizes) < 1:
            raise ScheduleError(f"partition sizes {sizes}: every stage needs at least one layer")
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def of(cls, value: Partition | Sequence[Sequence[int]]) -> Partition:
        """`value` itself, or the partition of a sequence of `(lo, hi)` ranges."""
        return value if isinstance(value, Partition) else cls.from_ranges(value)

    @classmethod
    def from_ranges(cls, ranges: Sequence[Sequence[int]]) -> Partition:
        """From `((lo, hi), ...)`, contiguous from layer 0."""
        sizes, prev = [], 0
        for s, (lo, hi) in enumerate(ranges):
            lo, hi = int(lo), int(hi)
            if lo != prev or hi <= lo:
                raise ScheduleError(f"partition stage {s} = layers [{lo}, {hi}) is not contiguous "
                                    f"after layer {prev} or is empty")
            sizes.append(hi - lo)
            prev = hi
        return cls(tuple(sizes))

    @classmethod
    def from_cuts(cls, cuts: Sequence[int], n_layers: int) -> Partition:
        """From the stage ends (exclusive) of all but the last stage."""
        edges = [0, *(int(b) for b in cuts), int(n_layers)]
        return cls(tuple(b - a for a, b in zip(edges[:-1], edges[1:])))

    @classmethod
    def uniform(cls, n_layers: int, n_stages: int) -> Partition:
        """Layers as evenly as counts allow, the extra ones first (Megatron-style)."""
        if n_stages > n_layers:
            raise ScheduleError(f"{n_stages} stages need at least {n_stages} layers; the model has {n_layers}")
        base, extra = divmod(n_layers, n_stages)
        return cls(tuple(base + (1 if s < extra else 0) for s in range(n_stages)))

    @classmethod
    def balanced(cls, weights: Sequence[float], n_stages: int) -> Partition:
        """Minimizes the largest stage sum of `weights` (`min_max_partition`, latest cut on ties)."""
        w = np.asarray(weights, dtype=np.float64)
        L = len(w)
        if not 1 <= n_stages <= L:
            raise ConfigError(f"cannot split {L} layers into {n_stages} non-empty stages; "
                              "choose fewer stages (pp × chunks ≤ layers)")
        ps = np.concatenate([[0.0], np.cumsum(w)])
        lo, hi = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
        span = np.where(hi > lo, ps[hi] - ps[lo], np.inf)
        out = min_max_partition(lambda s: span, n_stages, L, latest_ties=True)
        assert out is not None          # every stage sum is finite
        return out

    @cached_property
    def bounds(self) -> np.ndarray:
        """[S + 1] int64: 0, the first layer of stages 1.., the layer count (read-only)."""
        b = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        b.setflags(write=False)
        return b

    @cached_property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        b = [0, *accumulate(self.sizes)]
        return tuple(zip(b[:-1], b[1:]))

    @property
    def n_stages(self) -> int:
        return len(self.sizes)

    @property
    def n_layers(self) -> int:
        return int(self.bounds[-1])

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.ranges)

    def __getitem__(self, s):
        return self.ranges[s]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Partition):
            return self.sizes == other.sizes
        if isinstance(other, (tuple, list)):
            try:
                return self.ranges == tuple((int(lo), int(hi)) for lo, hi in other)
            except (TypeError, ValueError):
                return False
        return NotImplemented

    def __hash__(self) -> int:
        """The hash of `ranges` (equal sequences of ranges hash alike), computed once: the
        tuner hashes each candidate's partition many times."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(self.ranges)
        return h

    def __repr__(self) -> str:
        return f"Partition(sizes={self.sizes})"


def min_max_partition(stage_cost: Callable[[int], np.ndarray], n_stages: int, n_layers: int,
                      latest_ties: bool) -> Partition | None:
    """The consecutive partition minimizing the largest stage cost (exact DP, O(S · L²)).

    `stage_cost(s)[lo, hi]` is stage s's cost holding layers [lo, hi) ([L+1, L+1], inf where
    not allowed, e.g. empty). `best[s][j]`, the smallest bottleneck of stages 0..s over layers
    [0, j), takes the inner minimum vectorized; ties take the latest split point when
    `latest_ties`, else the earliest. None when no partition has a finite cost.
    """
    L = n_layers
    best = stage_cost(0)[0]
    cols = np.arange(L + 1)
    args = []
    for s in range(1, n_stages):
        cand = np.maximum(best[:, None], stage_cost(s))      # [lo, hi]
        idx = L - np.argmin(cand[::-1], axis=0) if latest_ties else np.argmin(cand, axis=0)
        best = cand[idx, cols]
        args.append(idx)
    if not np.isfinite(best[L]):
        return None
    cuts, j = [], L
    for idx in reversed(args):
        j = int(idx[j])
        cuts.append(j)
    return Partition.from_cuts(cuts[::-1], L)


def uniform_partition(n_layers: int, n_stages: int) -> Partition:
    """`Partition.uniform`."""
    return Partition.uniform(n_layers, n_stages)


def partition_from_sizes(sizes: Sequence[int]) -> Partition:
    """`Partition(sizes)`."""
    return Partition(tuple(sizes))


def _pieces_of(value: Mapping | None) -> dict[int, int]:
    if not value:
        return {}
    try:
        return {int(k): int(v) for k, v in sorted(dict(value).items(), key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"plan pieces={value!r}: expected a mapping of original layer index to "
                          "pieces, e.g. {\"11\": 3}") from e


@dataclass(frozen=True)
class SchedulePolicy:
    """The list-scheduling policy the tuner froze into a plan's table (`tune.candidate`), kept
    so the same plan can be scheduled again at another micro-batch count (the layout search
    tunes at few micro-batches and runs at many)."""

    split_backward: bool
    inflight: float                    # in-flight multiplier; inf: memory-bound
    kind_rank: tuple[int, ...]
    f_tiebreak: int
    b_tiebreak: int
    w_pressure: float
    warmup: tuple[int, ...] = ()       # per-stage offsets to the in-flight limits

    def to_doc(self) -> dict:
        """The plan JSON's `meta.policy` object (infinite in-flight as null)."""
        doc = {"split_backward": self.split_backward,
               "inflight": None if math.isinf(self.inflight) else float(self.inflight),
               "kind_rank": list(self.kind_rank), "f_tiebreak": self.f_tiebreak,
               "b_tiebreak": self.b_tiebreak, "w_pressure": self.w_pressure}
        if self.warmup:
            doc["warmup"] = list(self.warmup)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping, source: str = "plan JSON") -> SchedulePolicy:
        """Read `meta.policy`; a missing or mistyped field is one ScheduleError naming it."""
        try:
            inflight = doc["inflight"]
            return cls(bool(doc["split_backward"]), math.inf if inflight is None else float(inflight),
                       tuple(int(k) for k in doc["kind_rank"]), int(doc["f_tiebreak"]),
                       int(doc["b_tiebreak"]), float(doc["w_pressure"]),
                       tuple(int(x) for x in doc.get("warmup", ())))
        except KeyError as e:
            raise ScheduleError(f"{source}: meta.policy lacks the field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ScheduleError(f"{source}: meta.policy holds a value of the wrong type ({e})") from None


@dataclass(frozen=True)
class Plan:
    """Partition, table (which carries the placement) and `pieces`: {original layer index:
    pieces} of the layers split before partitioning ({} for whole layers), so the partition
    indexes the split model's layers. `policy`: the tuner's scheduling policy behind the table
    (None for a named schedule). `meta` is provenance only (origin, costs)."""

    partition: Partition             # a sequence of (lo, hi) ranges becomes one
    table: ScheduleTable
    model: str = ""
    cluster: str = ""
    meta: dict = field(default_factory=dict, compare=False)
    pieces: Mapping[int, int] = field(default_factory=dict, hash=False)
    policy: SchedulePolicy | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition", Partition.of(self.partition))
        legacy = None
        old = next((k for k in ("pieces", "shards") if k in (self.meta or {})), None)
        if old is not None:     # plans (and files) from before `Plan.pieces` kept them in meta
            meta = dict(self.meta)
            legacy = meta.pop(old)
            object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "pieces", _pieces_of(self.pieces or legacy))
        if len(self.partition) != self.table.n_stages:
            raise ScheduleError(f"partition has {len(self.partition)} stages but the table places "
                                f"{self.table.n_stages}")

    @property
    def placement(self) -> tuple[int, ...]:
        return self.table.placement

    @property
    def n_layers(self) -> int:
        return self.partition.n_layers


def plan_model(model: ModelSpec, plan: Plan) -> ModelSpec:
    """The model `plan` partitions: `model` with the layers `plan.pieces` names (original layer
    index -> pieces) split into pieces (`octopipe.model.pieces`), else `model` itself."""
    out = split_model(model, plan.pieces) if plan.pieces else model
    if plan.n_layers != out.n_layers:
        pieces = f" split as the plan's pieces say into {out.n_layers}" if out is not model else ""
        raise ConfigError(f"plan {plan.table.name!r} partitions {plan.n_layers} layers but model {model.name!r} "
                          f"has {model.n_layers}{pieces}; run the plan on the model it was made for")
    return out
