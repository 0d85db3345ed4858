"""The planner held to a stack's rules: every plan keeps them, none is slower than the stack's own
schedules, and on small instances none is slower than the best of all partitions (brute force)."""
from __future__ import annotations

import itertools

import pytest

from octopipe.interop.target_plan import plan_target
from octopipe.interop.targets import TARGETS, placement_of, violations
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import evaluate
from tests.interop.helpers import SSM, case, small_model


def _brute_force(c, schedule: str, chunks: int) -> float:
    """The fastest feasible plan of one named table over every partition of the modules."""
    return _brute_force_peak(c, schedule, chunks)[0]


def _brute_force_peak(c, schedule: str, chunks: int) -> tuple[float, float]:
    """The fastest feasible makespan over every partition of the modules, and its peak memory."""
    u = c.units
    table = build_schedule(schedule, c.n_devices, c.n_microbatches, chunks)
    problem = Problem.build(c.costs, c.cluster, c.n_devices, c.n_microbatches)
    best, peak = float("inf"), 0.0
    S = table.n_stages
    for cuts in itertools.combinations(range(1, u.n_units), S - 1):
        part = u.to_layers(Partition.from_cuts(cuts, u.n_units))
        ev = evaluate(problem, "x", "x", Plan(part, table))
        if ev.feasible and ev.makespan_s < best:
            best, peak = ev.makespan_s, float(ev.sim.peak_memory.max())
    return best, peak


@pytest.mark.parametrize("tight", [False, True])
def test_deepspeed_plan_is_the_best_partition_of_1f1b(tight):
    c = case(small_model("(*-)x6"), 3, 6)
    best, peak = _brute_force_peak(c, "1f1b", 1)
    if tight:     # memory below the fastest partition's peak: the answer must change
        c = case(small_model("(*-)x6"), 3, 6, memory_gib=0.97 * peak / 2 ** 30)
        best = _brute_force(c, "1f1b", 1)
        assert best > _brute_force_peak(case(small_model("(*-)x6"), 3, 6), "1f1b", 1)[0]
    got = plan_target(TARGETS["deepspeed"], c)
    assert got.makespan_s == pytest.approx(best, rel=1e-9)
    assert got.best.plan.table.placement == (0, 1, 2)


def test_megatron_plan_is_the_best_partition_of_its_schedules():
    c = case(small_model("(*-)x5"), 2, 4)
    got = plan_target(TARGETS["megatron"], c)
    best = min(_brute_force(c, "1f1b", 1), _brute_force(c, "interleaved", 2), _brute_force(c, "interleaved", 3))
    assert got.makespan_s == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("target", ["torch", "torchtitan", "megatron", "deepspeed"])
@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_target_plans_keep_the_rules_and_beat_the_stacks_schedules(target, model):
    m = small_model("(*-)x6") if model == "dense" else small_model("M-M*-M-M-", SSM)
    c = case(m, 2, 8)
    got = plan_target(TARGETS[target], c)
    assert violations(got.best.plan, TARGETS[target], c.units) == []
    assert got.best.feasible and got.best.checks.get("memory") == "fits"
    named = [b for b in got.baselines if b.feasible]
    assert named and all(got.makespan_s <= b.makespan_s * (1 + 1e-12) for b in named)
    if target in ("torchtitan", "megatron", "deepspeed"):
        assert c.units.aligned(got.best.plan.partition)


def test_torchtitan_v_placement_when_it_is_best():
    c = case(small_model("(*-)x6"), 2, 8)
    got = plan_target(TARGETS["torchtitan"], c)
    style, v = got.layout
    assert got.best.plan.table.placement == placement_of(style if style != "one" else "loop", 2, v)


def test_same_inputs_same_plan():
    c = case(small_model("(*-)x6"), 2, 8)
    a, b = plan_target(TARGETS["torchtitan"], c), plan_target(TARGETS["torchtitan"], c)
    assert a.best.plan.partition == b.best.plan.partition and a.best.plan.table.rows == b.best.plan.table.rows
