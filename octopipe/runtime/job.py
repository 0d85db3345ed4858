"""A runtime job: one plan, the model whose layers it runs and how to run it, as one value.

`execute(job)` launches it; in-situ calibration, the fidelity comparison, the benchmarks and
`mode=execute` all take the same value, so an option is set in one place (`RuntimeConfig`) and
read where it is used.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from octopipe.cluster import Cluster
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.model.spec import ModelSpec
from octopipe.plan import Plan


@dataclass(frozen=True)
class Fault:
    """Injected failure for tests: at `action` on `rank`, `raise`, `exit` (SIGKILL) or `hang`."""

    rank: int
    action: str
    kind: str = "raise"
    iteration: int = 0


@dataclass(frozen=True)
class Job:
    """What one launch runs: `config.warmup + config.iterations` iterations of `plan`.

    `model` builds the layers under `config.compute="real"` (None for emulated compute). `costs`
    and `cluster` are the modelled costs and the machine the simulator sees: emulated compute
    sleeps `costs` (scaled by `emulation`), measurement simulates with them. `pinned[rank]` is
    the core each rank is pinned to (None: the OS places them).
    """

    plan: Plan
    model: ModelSpec | None = None
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    seed: int = 0
    pinned: tuple[int, ...] | None = None
    costs: CostTable | None = field(default=None, repr=False)
    cluster: Cluster | None = None
    fault: Fault | None = None
    weights: object | None = None   # an asynchronous weight policy (asynchronous.runtime.WeightStash)
    # a within-launch A/B test: even iterations strict, odd ones config.dispatch (ready_first),
    # iteration 2k + 1 on the draws and data of 2k, so a launch's speed cancels in each pair
    ab_strict: bool = False

    @property
    def total_iterations(self) -> int:
        """Iterations a launch runs: the warm-up ones, then the measured ones."""
        return self.config.warmup + self.config.iterations

    @property
    def measured(self) -> range:
        """The indices of the measured iterations."""
        return range(self.config.warmup, self.total_iterations)
