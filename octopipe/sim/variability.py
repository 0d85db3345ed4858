"""Run-to-run variability: seeded lognormal jitter, occasional slow devices, Monte-Carlo runs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from octopipe.errors import ConfigError
from octopipe.sim.durations import Durations
from octopipe.sim.program import Program


def lognormal_factors(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    """Multiplicative noise with mean 1 and coefficient of variation `cv`."""
    if cv <= 0:
        return np.ones(n)
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2.0, np.sqrt(sigma2), n)


@dataclass(frozen=True)
class Jitter:
    """Compute times x lognormal(cv); transfers x lognormal(comm_cv, default cv); each device is
    slowed by `slow_factor` for the whole run with probability `slow_prob`."""

    cv: float = 0.0
    comm_cv: float | None = None
    slow_prob: float = 0.0
    slow_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.cv < 0 or (self.comm_cv is not None and self.comm_cv < 0):
            raise ConfigError(f"sim.jitter_cv={self.cv} must be >= 0")
        if not 0 <= self.slow_prob <= 1:
            raise ConfigError(f"sim.slow_prob={self.slow_prob} must lie in [0, 1]")
        if self.slow_factor < 1:
            raise ConfigError(f"sim.slow_factor={self.slow_factor} must be >= 1 (a slowdown)")

    @property
    def active(self) -> bool:
        return self.cv > 0 or (self.comm_cv or 0) > 0 or self.slow_prob > 0

    def apply(self, program: Program, dur: Durations, rng: np.random.Generator) -> Durations:
        comp = dur.compute * lognormal_factors(rng, self.cv, len(dur.compute))
        if self.slow_prob > 0:
            slow = np.where(rng.random(program.n_devices) < self.slow_prob, self.slow_factor, 1.0)
            comp = comp * slow[program.c_dev]
        comm_cv = self.cv if self.comm_cv is None else self.comm_cv
        trans = dur.transfer * lognormal_factors(rng, comm_cv, len(dur.transfer))
        return dur.scaled(compute=comp, transfer=trans)


@dataclass(frozen=True, eq=False)
class MonteCarlo:
    """Makespans of `n` seeded runs and their spread."""

    makespans: np.ndarray
    bubble_ratios: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.makespans.mean())

    @property
    def std(self) -> float:
        return float(self.makespans.std(ddof=1)) if len(self.makespans) > 1 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.makespans, q))

    def summary(self) -> dict:
        return {"runs": int(len(self.makespans)), "makespan_mean_s": self.mean,
                "makespan_std_s": self.std, "makespan_p50_s": self.percentile(50),
                "makespan_p90_s": self.percentile(90), "makespan_p99_s": self.percentile(99),
                "makespan_min_s": float(self.makespans.min()),
                "makespan_max_s": float(self.makespans.max()),
                "bubble_ratio_mean": float(self.bubble_ratios.mean())}
