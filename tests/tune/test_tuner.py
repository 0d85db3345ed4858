"""tune(): never worse than its starting points, memory-safe, reproducible, and its plan
round-trips through plan_io and re-simulates to the reported figures."""
import re

import numpy as np
import pytest

from octopipe.config.solver import SolverConfig
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError
from octopipe.plan_io import load_plan, save_plan
from octopipe.sim.simulator import simulate
from octopipe.tune import Candidate, Problem, TuneOptions, tune, tuner
from octopipe.tune import ilp_starts as ilp_starts_mod
from octopipe.tune.freeze import to_plan

from .helpers import free_cluster

CFG = {"time_budget_s": 30, "max_iters": 25, "patience": 10, "ilp": False}


def hetero_costs(n=12, seed=0):
    """Uneven layers (a heavy last 'head' layer), activations and parameters in bytes."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(1.0, 3.0, n)
    f[-1] = 6.0
    f = f[:, None] * 1e-3
    act = rng.uniform(1.0, 2.0, n) * 2**30
    return CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, f, 0.8 * f, act,
                     np.full(n, 2**30), np.full(n, 2**24), np.zeros(n), w_act_bytes=0.2 * act,
                     tokens_per_microbatch=4096)


def test_never_worse_than_baselines_and_given_start():
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    pb = Problem.build(costs, cl, 4, 8)
    start = Candidate((3, 3, 3, 3), (0, 1, 2, 3), split_backward=False, inflight=1.0, kind_rank=(1, 0, 2),
                      origin="given")
    start_ms = simulate(to_plan(pb, start), costs, cl).makespan
    res = tune(costs, cl, 4, 8, TuneOptions(CFG, starts=[start]))
    assert res.baselines and all(b.feasible for b in res.baselines)
    for b in res.baselines:
        assert res.makespan_s <= b.makespan_s * (1 + 1e-9), b.name
    assert res.makespan_s <= start_ms * (1 + 1e-9)
    s = res.summary()
    assert s["speedup_vs_best_baseline"] >= 1.0
    assert 0 < s["efficiency_vs_lower_bound"] <= 1.0 + 1e-9
    assert s["efficiency_vs_layer_bound"] >= s["efficiency_vs_lower_bound"]


def test_ilp_starts_join_the_search_and_are_never_beaten_by_the_plan():
    """The ILPs solve beside the search and their candidates join its pool: the plan is no
    slower than any of them, and the summary records the solves."""
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    cfg = {**CFG, "ilp": True}
    res = tune(costs, cl, 4, 8, TuneOptions(cfg))
    pb = Problem.build(costs, cl, 4, 8, contention=True)
    cands, info = ilp_starts_mod.partition_starts(pb, SolverConfig(max_nodes=100))
    assert cands and info["status"] in ("optimal", "feasible") and info["v"]["status"] in ("optimal", "feasible")
    assert res.ilp["status"] == info["status"]
    assert res.ilp["v"]["objective_s"] == pytest.approx(info["v"]["objective_s"])
    for c in cands:
        assert res.makespan_s <= simulate(to_plan(pb, c), costs, cl).makespan * (1 + 1e-9), c.origin
    again = tune(costs, cl, 4, 8, TuneOptions(cfg))
    assert again.plan.table.rows == res.plan.table.rows and again.plan.partition == res.plan.partition


def test_search_restarts_from_the_ilp_starts_when_no_starting_point_fits(monkeypatch):
    """When the search finds no starting point that fits (InfeasibleError), it runs again with
    the ILPs' candidates, whose partitions respect memory, first."""
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    real, seen = tuner.run_search, []

    def search(st, seed, progress):
        seen.append([c.origin for c in st.starts])
        if len(seen) == 1:
            raise InfeasibleError("no candidate fits memory")
        return real(st, seed, progress)
    monkeypatch.setattr(tuner, "run_search", search)
    res = tune(costs, cl, 4, 8, TuneOptions({**CFG, "ilp": True}))
    assert len(seen) == 2 and not any(o.startswith("ILP") for o in seen[0])
    assert seen[1][0].startswith("ILP") and seen[1][len(seen[1]) - len(seen[0]):] == seen[0]
    assert res.plan is not None
    monkeypatch.setattr(tuner, "run_search", lambda st, seed, progress: (_ for _ in ()).throw(
        InfeasibleError("no candidate fits memory")))
    with pytest.raises(InfeasibleError):
        tune(costs, cl, 4, 8, TuneOptions(CFG))


def test_plan_round_trips_and_resimulates(tmp_path):
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    res = tune(costs, cl, 4, 6, TuneOptions(CFG))
    path = save_plan(res.plan, tmp_path / "plan.json", tmp_path / "schedule.csv")
    back = load_plan(path)
    assert back.partition == res.plan.partition
    assert back.table.rows == res.plan.table.rows
    assert back.table.placement == res.plan.table.placement
    again = simulate(back, costs, cl)
    assert again.makespan == pytest.approx(res.makespan_s)
    assert float(again.bubble_ratio) == pytest.approx(res.summary()["bubble_ratio"])
    assert float(max(again.peak_memory)) == pytest.approx(res.summary()["peak_memory_bytes"])
    assert res.evaluated.checks["smt"] == "proved"


def test_plan_fits_tight_memory():
    costs = hetero_costs()
    cap = 18 * 2**30          # tight: most baselines run out of memory here
    cl = free_cluster(4, memory_bytes=cap)
    res = tune(costs, cl, 4, 16, TuneOptions(CFG))
    assert max(res.sim_result.peak_memory) <= cap
    oom = [b for b in res.baselines if b.sim is not None and max(b.sim.peak_memory) > cap]
    assert oom, "the capacity should bind for some baseline"
    assert all(not b.feasible and "out of memory" in b.note for b in oom)


def test_infeasible_memory_is_an_error():
    costs = hetero_costs()
    with pytest.raises(InfeasibleError, match="memory|fits"):
        tune(costs, free_cluster(4, memory_bytes=2 * 2**30), 4, 8, TuneOptions(CFG))


def test_seeded_and_reproducible():
    costs, cl = hetero_costs(seed=3), free_cluster(3)
    a = tune(costs, cl, 3, 6, TuneOptions(CFG, seed=5, baselines=False))
    b = tune(costs, cl, 3, 6, TuneOptions(CFG, seed=5, baselines=False))
    assert a.plan.partition == b.plan.partition
    assert a.plan.table.rows == b.plan.table.rows
    assert [h["makespan_s"] for h in a.history] == [h["makespan_s"] for h in b.history]


def test_blocking_semantics_get_a_lowered_deadlock_free_plan():
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    res = tune(costs, cl, 4, 8, TuneOptions(CFG, semantics="rendezvous"))
    assert res.plan.table.is_lowered
    assert res.evaluated.checks["smt"] == "proved"
    assert simulate(res.plan, costs, cl, semantics="rendezvous").makespan == pytest.approx(res.makespan_s)
    for b in res.baselines:
        assert res.makespan_s <= b.makespan_s * (1 + 1e-9)


def test_only_the_tuned_plan_fits(tmp_path):
    """When every baseline runs out of memory the tuner still plans, and says so."""
    from octopipe.tune.report_md import plan_report
    costs = hetero_costs()
    cap = 12 * 2**30
    res = tune(costs, free_cluster(4, memory_bytes=cap), 4, 16, TuneOptions(CFG))
    assert res.baselines and not any(b.feasible for b in res.baselines)
    assert max(res.sim_result.peak_memory) <= cap
    assert res.summary()["speedup_vs_best_baseline"] is None
    assert "no baseline fits" in res.versus_text()
    page = plan_report(res, "m", "c", 4, 16)
    assert "no baseline fits" in page
    # tables and sentences, never a Python repr of a dict or a value
    assert not re.search(r"\{'|': |\w+\(\w+=", page), page
    assert "The search ran" in page and "The ILP starting points did not run." in page
