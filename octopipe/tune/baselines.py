"""The baselines a plan is compared with, each at its best memory-feasible setting.

Uniform partitions (Megatron-style, group "uniform"): S-1F1B, interleaved 1F1B (I-1F1B, best
chunk count), ZB-H1, ZB-V. Balanced partitions (Mist/AdaPipe-style, group "balanced"): 1F1B and
ZB-H1 with the exact DP partition of `solvers` (memory-aware, one stage per device). A stronger
baseline of our own (group "balanced-v"): ZB-V with min-max balanced stages; it counts in
`speedup_vs_best_baseline` but not in the balanced group the targets name.
Every baseline is a named schedule table run through the full simulator.
"""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.errors import OctoPipeError
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import baselines as registry_baselines
from octopipe.schedule.library import build_schedule
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.evaluate import Evaluated, evaluate
from solvers.dp import dp_partition
from solvers.instance import Inflight, PartitionInstance


@dataclass(frozen=True)
class BaselineSpec:
    label: str
    schedule: str
    group: str            # "uniform" | "balanced" | "balanced-v"
    chunks: tuple[int, ...]


SPECS = tuple(BaselineSpec(b.label, name, b.group, b.chunks) for name, b in registry_baselines())


def named_table(name: str, n_devices: int, n_microbatches: int, chunks: int):
    return build_schedule(name, n_devices, n_microbatches, chunks=chunks)


def dp_balanced(problem: Problem, schedule: str, placement: tuple[int, ...]) -> Partition:
    """Exact memory-aware DP partition (solvers) for one stage per device; else min-max stages."""
    D = problem.n_devices
    if len(placement) == D and tuple(placement) == tuple(range(D)):
        try:
            inst = PartitionInstance.build(problem.costs, problem.cluster, D, placement,
                                           Inflight(schedule, problem.n_microbatches))
            res = dp_partition(inst)
            if res.fits_memory and res.partition:
                return res.partition
        except OctoPipeError:
            pass
    work = problem.layer_work().mean(axis=1)
    return Partition.balanced(work, len(placement))


def run_baselines(problem: Problem, model: str = "") -> list[Evaluated]:
    """Every baseline at its best memory-feasible chunk count (infeasible ones are kept, marked)."""
    out: list[Evaluated] = []
    D, M, L = problem.n_devices, problem.n_microbatches, problem.n_layers
    for spec in SPECS:
        best: Evaluated | None = None
        for v in spec.chunks:
            if D * v > L:
                continue
            try:
                table = named_table(spec.schedule, D, M, v)
            except OctoPipeError:
                continue
            if spec.group == "uniform":
                part = Partition.uniform(L, table.n_stages)
            else:
                part = dp_balanced(problem, spec.schedule, table.placement)
            plan = Plan(part, table, model=model, cluster=problem.cluster.name,
                        meta={"baseline": spec.label, "schedule": spec.schedule, "chunks": v})
            ev = evaluate(problem, spec.label + (f" (v={v})" if len(spec.chunks) > 1 else ""),
                          spec.group, plan)
            if best is None or (ev.feasible, -ev.makespan_s) > (best.feasible, -best.makespan_s):
                best = ev
        if best is not None:
            out.append(best)
    return out


def as_candidate(ev: Evaluated) -> Candidate:
    """A baseline's partition and placement as a tuner starting point."""
    plan = ev.plan
    split_backward = plan.table.splits_backward
    return Candidate(plan.partition, plan.table.placement, split_backward, 1.0, origin=ev.name)
