"""Plan: partition (stage → layer range), placement and schedule table, as one value."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from octopipe.errors import ConfigError, ScheduleError
from octopipe.schedule.table import ScheduleTable

if TYPE_CHECKING:
    from octopipe.model.spec import ModelSpec


@dataclass(frozen=True)
class Plan:
    """`partition[s] = (lo, hi)`: stage s holds layers lo..hi-1; the table carries placement."""

    partition: tuple[tuple[int, int], ...]
    table: ScheduleTable
    model: str = ""
    cluster: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition", tuple((int(a), int(b)) for a, b in self.partition))
        if len(self.partition) != self.table.n_stages:
            raise ScheduleError(f"partition has {len(self.partition)} stages but the table places "
                                f"{self.table.n_stages}")
        prev = 0
        for s, (lo, hi) in enumerate(self.partition):
            if lo != prev or hi <= lo:
                raise ScheduleError(f"partition stage {s} = layers [{lo}, {hi}) is not contiguous "
                                    f"after layer {prev} or is empty")
            prev = hi

    @property
    def placement(self) -> tuple[int, ...]:
        return self.table.placement

    @property
    def n_layers(self) -> int:
        return self.partition[-1][1]


def uniform_partition(n_layers: int, n_stages: int) -> tuple[tuple[int, int], ...]:
    """Split layers as evenly as counts allow (Megatron-style uniform layers per stage)."""
    if n_stages > n_layers:
        raise ScheduleError(f"{n_stages} stages need at least {n_stages} layers; the model has {n_layers}")
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return tuple(out)


def partition_from_sizes(sizes: Sequence[int]) -> tuple[tuple[int, int], ...]:
    out, lo = [], 0
    for n in sizes:
        out.append((lo, lo + n))
        lo += n
    return tuple(out)


def plan_shards(plan: Plan) -> dict[int, int]:
    """`plan.meta["shards"]` as {original layer index: pieces} ({} for a plan of whole layers)."""
    shards = (plan.meta or {}).get("shards")
    if not shards:
        return {}
    try:
        return {int(k): int(v) for k, v in dict(shards).items()}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"plan meta shards={shards!r}: expected a mapping of original layer index to "
                          "pieces, e.g. {\"11\": 3}") from e


def plan_model(model: "ModelSpec", plan: Plan) -> "ModelSpec":
    """The model `plan` partitions: `model` with the layers `plan.meta["shards"]` names (original
    layer index -> pieces) split into pieces (`octopipe.model.shard`), else `model` itself."""
    from octopipe.model.shard import shard_model
    counts = plan_shards(plan)
    out = shard_model(model, counts) if counts else model
    if plan.n_layers != out.n_layers:
        split = f" split as meta shards says into {out.n_layers}" if out is not model else ""
        raise ConfigError(f"plan {plan.table.name!r} partitions {plan.n_layers} layers but model {model.name!r} "
                          f"has {model.n_layers}{split}; run the plan on the model it was made for")
    return out
