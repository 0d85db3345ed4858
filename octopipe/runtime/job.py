"""A runtime job: one plan, the model whose layers it runs and how to run it, as one value.

`execute(job)` launches it; in-situ calibration, the fidelity comparison, the benchmarks and
`mode=execute` all take the same value, so an option is set in one place (`RuntimeConfig`) and
read where it is used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from octopipe.cluster import Cluster
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.model.spec import ModelSpec
from octopipe.model.user_module import UserBlocks
from octopipe.plan import Plan
from octopipe.runtime.stage import SpecBlocks


class BatchSource(Protocol):
    """The data of a real run: the inputs and targets of micro-batch `mb` of `iteration`."""

    def batch(self, iteration: int, mb: int) -> dict: ...


class WeightPolicy(Protocol):
    """An asynchronous weight policy (`octopipe.asynchronous.runtime.WeightStash`): which weight
    version each micro-batch reads, and the update after each backward."""

    def bind(self, stage: int, module: torch.nn.Module) -> None: ...

    def forward_params(self, stage: int, mb: int) -> dict[str, torch.Tensor]: ...

    def params(self, stage: int, mb: int) -> list[torch.Tensor]: ...

    def backward_done(self, stage: int, mb: int, grads) -> None: ...

    def state(self) -> dict[str, torch.Tensor]: ...


# the layers a real run builds: a preset's ModelSpec (or its `SpecBlocks`), or a user's blocks
Layers = ModelSpec | SpecBlocks | UserBlocks


@dataclass(frozen=True)
class Fault:
    """Injected failure for tests: at `action` on `rank`, `raise`, `exit` (SIGKILL) or `hang`."""

    rank: int
    action: str
    kind: str = "raise"
    iteration: int = 0


@dataclass(frozen=True)
class DataParallel:
    """`dp` replicas of the pipeline, their gradients averaged after each stage's last backward;
    `zero`: AdamW state sharded over each stage's replicas (what mode=train's train.dp and
    train.zero ask for)."""

    dp: int = 1
    zero: bool = False


@dataclass(frozen=True)
class Job:
    """What one launch runs: `config.warmup + config.iterations` iterations of `plan`.

    `model` builds the layers under `config.compute="real"` (None for emulated compute): a
    preset's ModelSpec or a user's blocks (`mode=train` launches its jobs the same way). `costs`
    and `cluster` are the modelled costs and the machine the simulator sees: emulated compute
    sleeps `costs` (scaled by `emulation`), measurement simulates with them. `pinned[rank]` is
    the core each rank is pinned to (None: the OS places them).
    """

    plan: Plan
    model: Layers | None = None
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    seed: int = 0
    pinned: tuple[int, ...] | None = None
    costs: CostTable | None = field(default=None, repr=False)
    cluster: Cluster | None = None
    fault: Fault | None = None
    weights: WeightPolicy | None = None   # an asynchronous weight policy (asynchronous.runtime.WeightStash)
    # a within-launch A/B test: even iterations strict, odd ones config.dispatch (ready_first),
    # iteration 2k + 1 on the draws and data of 2k, so a launch's speed cancels in each pair
    ab_strict: bool = False
    data: BatchSource | None = None       # real compute: the batches (None: synthetic tokens)
    autocast: str = ""                    # real compute: "" (fp32) | bfloat16 (forwards under autocast)
    init_method: str = ""                 # the process group's rendezvous ("": a free local port)
    timeout_name: str = "runtime.timeout_s"   # the setting config.timeout_s came from (for messages)
    recompute: tuple[int, ...] = ()       # real compute: the stages whose forward is rerun inside their backward
    data_parallel: DataParallel = field(default_factory=DataParallel)

    @property
    def world(self) -> int:
        """Processes a launch starts: pipeline ranks x replicas x TP ranks."""
        return self.plan.table.n_devices * self.data_parallel.dp * self.config.tp

    @property
    def total_iterations(self) -> int:
        """Iterations a launch runs: the warm-up ones, then the measured ones."""
        return self.config.warmup + self.config.iterations

    @property
    def measured(self) -> range:
        """The indices of the measured iterations."""
        return range(self.config.warmup, self.total_iterations)

    @property
    def metered(self) -> range:
        """The iterations whose saved bytes are counted: the warm-up ones (the meter's hooks cost
        a Python call per saved tensor and would slow the measured ones), else the measured."""
        return range(self.config.warmup) or self.measured
