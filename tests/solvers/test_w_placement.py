"""The W-placement ILP (solvers.w_placement) against brute force: every way to put each W in a
gap of its device's row, simulated by octopipe.sim, within the activation budget."""
import itertools

import numpy as np
import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.plan import Partition, Plan
from octopipe.schedule.action import ActionKind
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from solvers.w_placement import WInstance, place_ws

GIB = 2.0**30


def cluster(p):
    free = Link("free", np.inf, 0.0)
    return Cluster("t", (DeviceKind("dev", 1e15, 1e18, 3e12),), (0,) * p, (0,) * p, free, free)


def costs(p, seed):
    rng = np.random.default_rng(seed)
    f, i, w = (rng.uniform(0.5, 2.0, (p, 1)) for _ in range(3))
    act = rng.uniform(0.5, 1.5, p) * GIB
    return CostTable(tuple(f"l{j}" for j in range(p)), ("dev",), f, i, w, act, np.zeros(p),
                     np.zeros(p), np.zeros(p), w_act_bytes=0.5 * act, tokens_per_microbatch=1)


def instance(table, c, budget):
    p = table.n_stages
    return WInstance(table.rows, c.f[:, 0], c.i[:, 0], c.w[:, 0], np.zeros(p), np.zeros(p),
                     c.act_bytes, c.w_act_bytes, budget)


def placements(row):
    """Every row with the same F/I order and each W in a gap after its own I."""
    core = [a for a in row if a.kind != ActionKind.W]
    ws = sorted((a for a in row if a.kind == ActionKind.W), key=lambda a: (a.microbatch, a.stage))
    firsts = [core.index(a._replace(kind=ActionKind.I)) + 1 for a in ws]
    for gaps in itertools.product(*(range(f, len(core) + 1) for f in firsts)):
        out = []
        for k in range(len(core) + 1):
            out += [a for a, g in zip(ws, gaps) if g == k]
            if k < len(core):
                out.append(core[k])
        yield tuple(out)


def brute(table, c, cl, budget):
    best = np.inf
    for rows in itertools.product(*(list(placements(r)) for r in table.rows)):
        sim = simulate(Plan(Partition.uniform(table.n_stages, table.n_stages), table.with_rows(rows)), c, cl)
        if np.all(sim.peak_activation_memory <= budget * (1 + 1e-9)):
            best = min(best, float(sim.makespan))
    return best


@pytest.mark.parametrize("p,m,seed,tight", [(2, 2, 0, False), (2, 3, 1, True), (3, 2, 2, False),
                                            (3, 2, 3, True), (2, 3, 4, False)])
def test_ilp_equals_brute_force(p, m, seed, tight):
    c, cl = costs(p, seed), cluster(p)
    table = build_schedule("zbh1", p, m)
    table = table.with_rows([tuple(a for a in r if a is not None) for r in table.rows])
    base = simulate(Plan(Partition.uniform(p, p), table), c, cl)
    budget = base.peak_activation_memory.copy() if tight else np.full(p, np.inf)
    res = place_ws(instance(table, c, budget))
    assert res.proven_optimal
    opt = brute(table, c, cl, budget)
    assert res.makespan == pytest.approx(opt, rel=1e-6)
    sim = simulate(Plan(Partition.uniform(p, p), table.with_rows(res.rows)), c, cl)
    assert float(sim.makespan) == pytest.approx(res.makespan, rel=1e-6)
    assert np.all(sim.peak_activation_memory <= budget * (1 + 1e-9))
    assert res.makespan <= float(base.makespan) * (1 + 1e-6)
