"""The exhaustive table search (solvers.exhaustive_tables) against brute force: every row order
of every device, timed by octopipe's simulator, the shortest that runs and fits the budget."""
import functools
import itertools
import math

import pytest

from octopipe.errors import DeadlockError, InfeasibleError
from octopipe.measure.bench.memory_optimality import (
    Case,
    cluster_of,
    compare,
    costs_of,
    gpt_case,
    instance_of,
    random_case,
    rows_of,
)
from octopipe.measure.bench.zero_bubble import rows_plan
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from solvers.exhaustive_tables import exhaustive_table, time_rows
from solvers.zb_auto import ZbInstance

SLACK = 1 + 1e-9


def row_orders(m):
    """Every order of F, I, W of `m` micro-batches on one device in which each micro-batch's
    F comes before its I and its I before its W (any other order deadlocks at once)."""
    acts = [(k, j) for j in range(m) for k in range(3)]
    for perm in itertools.permutations(acts):
        pos = {a: n for n, a in enumerate(perm)}
        if all(pos[(0, j)] < pos[(1, j)] < pos[(2, j)] for j in range(m)):
            yield perm


@functools.cache
def all_tables(case):
    """(makespan, peak activation bytes) of every table of `case` that runs to the end."""
    costs, cl = costs_of(case), cluster_of(case)
    orders = list(row_orders(case.m))
    out = []
    for rows in itertools.product(orders, repeat=case.p):
        try:
            sim = simulate(rows_plan(rows, case.m, "brute"), costs, cl)
        except DeadlockError:
            continue
        out.append((sim.makespan, float(sim.peak_activation_memory.max())))
    return out


def brute_force(case, budget):
    """The least simulated makespan over all tables within `budget` bytes per device."""
    return min((t for t, peak in all_tables(case) if peak <= budget * SLACK), default=math.inf)


def case(f, i, w, comm=0.0, act_w=0.0, m=2, multiple=None):
    p = len(f)
    return Case("t", tuple(f), tuple(i), tuple(w), (1.0,) * p, (act_w,) * p, comm, m, multiple)


def with_budget(inst, budget):
    return ZbInstance(inst.f, inst.b, inst.w, inst.mem_f, inst.mem_w, (budget,) * inst.n_stages,
                      inst.comm, inst.n_microbatches)


TINY = [case((1, 1), (1, 1), (1, 1)),
        case((2, 1), (1, 3), (1, 2), comm=0.5, act_w=0.5),
        case((1, 2), (2, 1), (3, 1), comm=1.0, act_w=0.25),
        case((1.5, 1), (1, 1.25), (0.5, 2), comm=0.25, act_w=0.75)]


@pytest.mark.parametrize("c", TINY)
@pytest.mark.parametrize("budget", [1.0, 1.5, 2.0, math.inf])
def test_optimum_equals_brute_force_p2_m2(c, budget):
    inst = with_budget(instance_of(c), budget)
    got = exhaustive_table(inst)
    assert got.proven
    sim = simulate(rows_plan(got.rows, c.m, "exact"), costs_of(c), cluster_of(c))
    assert sim.makespan == pytest.approx(got.makespan, rel=1e-12)
    assert sim.peak_activation_memory.max() <= budget * SLACK
    assert got.makespan == pytest.approx(brute_force(c, budget), rel=1e-12)


def test_budget_below_one_activation_is_infeasible():
    inst = with_budget(instance_of(TINY[0]), 0.5)
    with pytest.raises(InfeasibleError):
        exhaustive_table(inst)


SMALL = [case((1, 1.5, 1), (1, 1, 2), (1, 0.5, 1), comm=0.25, act_w=0.5, m=4, multiple=1.0),
         case((1, 1, 1), (1, 1, 1), (1, 1, 1), act_w=0.37, m=4, multiple=1.0),
         case((2, 1, 1), (1, 2, 1), (2, 1, 1), comm=1.0, m=3, multiple=2.0)]


@pytest.mark.parametrize("c", SMALL)
@pytest.mark.parametrize("name", ["1f1b", "zbh1", "zbh2"])
def test_optimum_never_above_a_named_schedule_within_the_budget(c, name):
    inst = instance_of(c)
    sim = simulate(Plan(Partition.uniform(c.p, c.p), build_schedule(name, c.p, c.m)),
                   costs_of(c), cluster_of(c))
    if sim.peak_activation_memory.max() > inst.max_mem[0] * SLACK:
        assert name == "zbh2"       # ZB-H2 holds about twice 1F1B's activations
        return
    assert exhaustive_table(inst).makespan <= sim.makespan * SLACK


@pytest.mark.parametrize("c", [gpt_case(3, 4, 1.0), gpt_case(3, 3, 1.0), random_case(3, 3, 1.0, 1)])
def test_tuner_reaches_the_optimum_under_the_budget(c):
    """Measured: at 1x S-1F1B's activations the tuner's plan is an optimal table, and zero-bubble's
    scheduler is 0.9% above it at p=3, m=3."""
    row = compare(c)
    assert row.memory_lower_bound <= row.optimum * SLACK
    assert row.tuner == pytest.approx(row.optimum, rel=1e-9)
    assert row.optimum <= row.zb_auto * SLACK


def test_tuner_above_the_optimum_without_a_budget():
    """Measured: with no budget the tuner's plan at p=3, m=4 (GPT ratios) is 0.71% above the best
    table (14.2 against 14.1; with the 1x or 2x budget it reaches 14.8 and 14.1, the optima, where
    zero-bubble's scheduler is among its seeds)."""
    row = compare(gpt_case(3, 4, None))
    assert row.memory_lower_bound <= row.optimum * SLACK
    assert row.optimum * (1 + 0.007) < row.tuner <= row.optimum * (1 + 0.0072)


@pytest.mark.parametrize("c", SMALL)
def test_an_incumbent_leaves_the_optimum_unchanged(c):
    inst = instance_of(c)
    plain = exhaustive_table(inst)
    assert time_rows(inst, plain.rows) == pytest.approx(plain.makespan, rel=1e-12)
    seeded = exhaustive_table(inst, incumbent=rows_of(build_schedule("1f1b", c.p, c.m)))
    assert seeded.proven
    assert seeded.makespan == pytest.approx(plain.makespan, rel=1e-12)


def test_time_rows_refuses_a_table_that_deadlocks():
    inst = instance_of(TINY[0])
    with pytest.raises(InfeasibleError):
        time_rows(inst, (((0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)),
                         ((1, 0), (0, 0), (2, 0), (0, 1), (1, 1), (2, 1))))


@pytest.mark.slow
@pytest.mark.parametrize("budget", [1.0, 1.5, 2.0, math.inf])
def test_optimum_equals_brute_force_p3_m2(budget):
    c = case((1, 2, 1), (2, 1, 1.5), (1, 1, 0.5), comm=0.5, act_w=0.5)
    got = exhaustive_table(with_budget(instance_of(c), budget))
    assert got.makespan == pytest.approx(brute_force(c, budget), rel=1e-12)
