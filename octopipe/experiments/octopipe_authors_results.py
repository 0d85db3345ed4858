"""The values of `experiment=octopipe_authors`: its cases, each schedule's outcome on a case, the
check against the authors' figures, and the speedups of the OctoPipe plan; the driver
(`octopipe_authors`) computes them, the report (`octopipe_authors_report`) renders them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    profile: str
    devices: int
    microbatches: int
    comm: str

    @property
    def label(self) -> str:
        return f"{self.profile} p={self.devices} m={self.microbatches} comm={self.comm}"


@dataclass(frozen=True, eq=False)
class Outcome:
    """One schedule on one case: simulated makespan and the devices' compute seconds."""

    case: Case
    schedule: str
    makespan_s: float
    busy_s: np.ndarray
    lower_bound_s: float
    partition: tuple[tuple[int, int], ...]
    placement: tuple[int, ...]
    tuner_s: float | None = None
    device_bound_s: float | None = None    # whole layers + fill/drain (octopipe.tune.bounds)
    pieces: dict = field(default_factory=dict)   # profile row -> pieces the plan split it into

    @property
    def bubble_ratio(self) -> np.ndarray:
        return 1.0 - self.busy_s / self.makespan_s

    @property
    def efficiency(self) -> float:
        return self.lower_bound_s / self.makespan_s

    @property
    def cross_device_boundaries(self) -> int:
        """Stage boundaries whose two sides sit on different devices (a transfer each way)."""
        return int(sum(a != b for a, b in zip(self.placement, self.placement[1:])))

    def row(self) -> dict[str, Any]:
        return {
            "profile": self.case.profile, "devices": self.case.devices,
            "microbatches": self.case.microbatches, "comm": self.case.comm,
            "schedule": self.schedule, "makespan_ms": self.makespan_s * 1e3,
            "bubble_ratio_per_device": [float(x) for x in self.bubble_ratio],
            "bubble_ratio_mean": float(self.bubble_ratio.mean()),
            "efficiency_vs_lower_bound": self.efficiency,
            "lower_bound_ms": self.lower_bound_s * 1e3,
            "stage_sizes": [hi - lo for lo, hi in self.partition],
            "placement": list(self.placement),
            "cross_device_boundaries": self.cross_device_boundaries,
            "tuner_s": self.tuner_s,
            "device_bound_ms": None if self.device_bound_s is None else self.device_bound_s * 1e3,
            "efficiency_vs_device_bound": (None if self.device_bound_s is None
                                           else self.device_bound_s / self.makespan_s),
            "split_rows": {str(k): v for k, v in self.pieces.items()},
        }


@dataclass(frozen=True)
class CheckRow:
    schedule: str
    ours_ms: float
    authors_ms: float
    convention: str

    @property
    def difference_ms(self) -> float:
        return self.ours_ms - self.authors_ms


@dataclass
class Results:
    outcomes: list[Outcome] = field(default_factory=list)
    check: list[CheckRow] = field(default_factory=list)
    tuner: bool = False
    note: str = ""


def speedups(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Baseline makespan over the OctoPipe plan's, per baseline, and over the best baseline."""
    ours = [o for o in outcomes if o.schedule == "octopipe"]
    if not ours:
        return {}
    base = {o.schedule: o.makespan_s for o in outcomes if o.schedule != "octopipe"}
    out = {f"speedup_vs_{k}": v / ours[0].makespan_s for k, v in base.items()}
    out["speedup_vs_best_baseline"] = min(base.values()) / ours[0].makespan_s
    return out
