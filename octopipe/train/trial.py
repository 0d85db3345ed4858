"""The tuner's plan against the fastest named schedule, measured before a run trains.

The tuner ranks plans on profiled costs. Where those costs misjudge a kind of plan (on a CPU
machine, ranks holding several stages run 10-13% longer than the profiled blocks plus host time
say, while one stage per rank runs as they say: docs/training.md), its pick can train slower
than 1F1B. A short trial settles it by measurement: each candidate trains `steps` steps after
one to warm up, launched as the run itself will be, and the lower median step wins (the tuner's
plan on a tie). The trial's weights are thrown away; the run starts afresh on the winner.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from octopipe.plan import Plan
from octopipe.runtime.job import Job
from octopipe.train.loop import TrainSpec, launch_training
from octopipe.tune.tune_result import TuneResult


@dataclass(frozen=True)
class TrialOutcome:
    """Each candidate's name, simulated and measured seconds per step; `chosen` indexes the winner."""

    names: tuple[str, ...]
    predicted_s: tuple[float, ...]
    step_s: tuple[float, ...]
    steps: int
    chosen: int

    def record(self) -> dict:
        """summary.json's `plan_trial`."""
        return {"candidates": list(self.names), "predicted_iteration_s": list(self.predicted_s),
                "measured_step_s": list(self.step_s), "steps": self.steps, "chosen": self.names[self.chosen]}

    def line(self) -> str:
        """The report's line."""
        figures = ", ".join(f"{n} {t:.3f} s (simulated iteration {p:.3f} s)"
                            for n, t, p in zip(self.names, self.step_s, self.predicted_s))
        return (f"plan trial, median step of {self.steps} after one to warm up: {figures}; "
                f"training {self.names[self.chosen]}")


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans run the same stages, placement, split layers and rows."""
    return (a.partition.ranges, a.placement, dict(a.pieces), a.table.n_devices) == \
        (b.partition.ranges, b.placement, dict(b.pieces), b.table.n_devices) \
        and all(a.table.actions(d) == b.table.actions(d) for d in range(a.table.n_devices))


def trial_candidates(res: TuneResult, trial_steps: int) -> tuple:
    """The tuner's plan and the fastest feasible named schedule it simulated, each with its
    simulated iteration, when `trial_steps` > 0 and they differ (a plan with split layers is
    kept as it is: its layers are not the named schedule's)."""
    feasible = [b for b in res.baselines if b.feasible and b.plan is not None]
    if trial_steps <= 0 or not feasible or res.plan.pieces:
        return ()
    best = min(feasible, key=lambda b: b.makespan_s)
    if same_plan(best.plan, res.plan):
        return ()
    return (res.plan.table.name, res.plan, res.makespan_s), (best.name, best.plan, best.makespan_s)


def winner(step_s: Sequence[float]) -> int:
    """The index of the lowest time; the first of equals (the tuner's plan comes first)."""
    return int(np.argmin(np.asarray(step_s, dtype=float)))


def median_step(records: list[dict]) -> float:
    """The median step seconds after the first (warm-up) step."""
    return float(np.median([r["step_s"] for r in records[1:]]))


def run_trial(candidates: Sequence[tuple[str, Plan, float]], job_of: Callable[[Plan], Job], spec: TrainSpec,
              steps: int, progress: Callable[[str], None] = lambda _: None) -> TrialOutcome:
    """Train each (name, plan, simulated iteration seconds) for `steps` + 1 steps of `spec` (no
    checkpoints) on `job_of(plan)`, one after another, and name the faster."""
    times = []
    trial = replace(spec, steps=spec.start + steps + 1, checkpoint_every=0, checkpoint_dir="")
    for name, plan, _ in candidates:
        progress(f"plan trial: {name}, {steps + 1} steps")
        with tempfile.TemporaryDirectory(prefix="octopipe-trial-") as tmp:
            run = launch_training(job_of(plan), trial, tmp)
        times.append(median_step(run.records))
    return TrialOutcome(tuple(n for n, _, _ in candidates), tuple(float(p) for _, _, p in candidates),
                        tuple(times), steps, winner(times))
