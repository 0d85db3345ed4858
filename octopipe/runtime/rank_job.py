"""What every rank of a launch gets, resolved and picklable: `RankJob`, in typed parts.

`launch.rank_job` builds it from a `Job` (the one route into the runtime, for `mode=execute`,
the benchmarks and `mode=train` alike); it is identical for all ranks, which read their own row
of the table by rank.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from octopipe.runtime.dispatch import Arbitration
from octopipe.runtime.job import BatchSource, Fault, Layers, WeightPolicy
from octopipe.runtime.tensor_parallel import Grid
from octopipe.schedule.table import ScheduleTable


@dataclass(frozen=True)
class Wiring:
    """How the ranks reach each other: the process group and the message transport."""

    world: int                              # processes: pipeline ranks x dp x tp
    init_method: str                        # tcp://host:port, or env:// under torchrun
    backend: str = "gloo"
    transport: Literal["tagged", "ordered"] = "tagged"   # resolved by `choose_transport`
    device: Literal["cpu", "cuda"] = "cpu"                # resolved by `choose_transport`


@dataclass(frozen=True)
class ComputeSpec:
    """How an action computes: real layers (`layers`, with `data` and `autocast`) or sleeps of
    `durations` with messages of `message_elems` float32 elements (emulated)."""

    kind: Literal["real", "emulated"] = "real"
    layers: Layers | None = None            # real: what each rank builds its stages from
    data: BatchSource | None = None         # real: None draws synthetic tokens
    autocast: str = ""                      # real: "" (fp32) | bfloat16 (forwards under autocast)
    durations: Mapping[int, tuple[float, float, float]] = field(default_factory=dict)   # stage -> f, i, w s
    message_elems: Mapping[int, int] = field(default_factory=dict)                      # stage boundary -> elems
    threads: int = 1                        # torch threads per rank
    cpus: tuple[int, ...] = ()              # cpus[rank]: the core that rank is pinned to (empty: not pinned)
    recompute: tuple[int, ...] = ()         # real: the stages whose forward is rerun inside their backward


@dataclass(frozen=True)
class TensorParallelSpec:
    """World rank r is TP rank r % tp of pipeline rank r // tp; `agree_stages[s]`: whether stage
    s's F, I, W run TP collectives (`sim.agreement.agreement_stages`; empty: F, I, B everywhere)."""

    tp: int = 1
    agree_stages: tuple[tuple[bool, bool, bool], ...] = ()


@dataclass(frozen=True)
class DataParallelSpec:
    """`dp` replicas of the pipeline (`Grid`'s order); replica d runs micro-batches d*m .. d*m+m-1
    of each step. After a stage's last backward its gradients are averaged over the replicas,
    in buckets of at most `bucket_bytes`, started at once (they overlap the rest of the row);
    `zero`: reduce-scattered instead, each replica owning whole parameters' AdamW state."""

    dp: int = 1
    zero: bool = False
    bucket_bytes: int = 25 * 2 ** 20


@dataclass(frozen=True)
class RankJob:
    """One launch as every rank sees it: the plan's partition and compute-only table, and the
    parts above; `iterations` of SGD at `lr` (0: none) unless a training loop drives the rank."""

    partition: tuple[tuple[int, int], ...]
    table: ScheduleTable
    wiring: Wiring
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    tensor_parallel: TensorParallelSpec = field(default_factory=TensorParallelSpec)
    arbitration: Arbitration = field(default_factory=Arbitration)
    weights: WeightPolicy | None = None     # asynchronous updates, applied per backward
    dispatch: Literal["strict", "ready_first"] = "ready_first"
    iterations: int = 1
    metered: tuple[int, ...] | None = None  # iterations whose saved bytes are counted (`Job.metered`); None: all
    seed: int = 0
    lr: float = 0.0
    result_dir: str = ""
    fault: Fault | None = None
    ab_strict: bool = False                 # even iterations strict, odd ones `dispatch` (`Job`)
    data_parallel: DataParallelSpec = field(default_factory=DataParallelSpec)

    @property
    def model(self) -> Layers | None:
        """The layers real compute builds (None under emulated compute)."""
        return self.compute.layers

    @property
    def tp(self) -> int:
        return self.tensor_parallel.tp

    @property
    def dp(self) -> int:
        return self.data_parallel.dp

    @property
    def grid(self) -> Grid:
        """The world's pipeline x replica x TP ranks."""
        return Grid(self.wiring.world // (self.dp * self.tp), self.tp, self.dp)
