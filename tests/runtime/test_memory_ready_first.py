"""ready_first's default cap on two real ranks: each rank holds its row's micro-batches and no more,
so the measured memory is the simulated peak's."""
from __future__ import annotations

import pytest

from octopipe.cluster import Link
from octopipe.config.cost import AnalyticCost
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.measure.memory import memory_figures, rank_layer_bytes
from octopipe.plan import Plan
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.library import build_schedule
from octopipe.sim.hints import row_need
from tests.runtime.tiny import attn, emb, head, mamba1, mamba2, mlp, model

MODEL = model([emb(), mamba2(), attn(), mlp(), mamba1(), mlp(), head()])


def _held(events, table, it: int) -> list[int]:
    """Per rank, the most micro-batches live at once in the order it ran iteration `it`."""
    out = []
    for d, ev in enumerate(events):
        acts = {str(a): a for a in table.actions(d)}
        ran = [acts[e["action"]] for e in sorted((e for e in ev if e.get("it") == it and "action" in e),
                                                 key=lambda e: e["start"])]
        out.append(row_need(ran))
    return out


def test_ready_first_memory_agrees_with_the_simulated_peak_per_rank():
    """1F1B on two real ranks under the default dispatch (ready_first, max_inflight=plan): every
    rank holds its row's need in every measured iteration, and its measured bytes are within 10%
    of the simulator's peak (uncapped, rank 0 ran forwards ahead: 4-5 live, 100-120% over)."""
    cluster = local_cluster(2, Link("loopback", 5e8, 1e-4))
    plan = Plan(((0, 3), (3, 7)), build_schedule("1f1b", 2, 6))
    config = RuntimeConfig(compute="real", calibrate=False, grad_check=False, pin="false", iterations=2,
                           warmup=1, timeout_s=120.0)
    assert config.dispatch == "ready_first" and config.max_inflight == "plan"
    job = Job(plan, MODEL, config, costs=analytic_costs(AnalyticCost(), MODEL, cluster), cluster=cluster)
    res = execute(job)
    table = plan.table.compact().compute_only()
    need = [row_need(table.actions(r)) for r in range(2)]
    assert need == [2, 1]
    for it in job.measured:
        assert _held(res.events, table, it) == need, it
    d = memory_figures(job, res, None, rank_layer_bytes(job, MODEL, "cpu"))
    assert d["memory_max_rel_err"] <= 0.10, d
    assert d["memory_measured_bytes"] == pytest.approx(d["memory_simulated_bytes"], rel=0.10)
    assert d["memory_executed_max_rel_err"] <= 1e-9, d      # the memory model, on the order each rank ran


def test_only_the_warm_up_iterations_are_metered():
    """The meter's hooks would slow the measured iterations, so it counts in the warm-up only: a
    warm-up iteration reports its peak, a measured one 0; the memory figure is the warm-up's."""
    cluster = local_cluster(2, Link("loopback", 5e8, 1e-4))
    plan = Plan(((0, 3), (3, 7)), build_schedule("1f1b", 2, 2))
    config = RuntimeConfig(compute="real", dispatch="strict", calibrate=False, grad_check=False, pin="false",
                           iterations=2, warmup=1, timeout_s=120.0)
    job = Job(plan, MODEL, config, costs=analytic_costs(AnalyticCost(), MODEL, cluster), cluster=cluster)
    res = execute(job)
    for ev in res.events:
        peaks = {e["it"]: e["saved_peak_bytes"] for e in ev if "saved_peak_bytes" in e}
        assert peaks[0] > 0 and peaks[1] == peaks[2] == 0, peaks
    d = memory_figures(job, res, None, rank_layer_bytes(job, MODEL, "cpu"))
    assert d["memory_max_rel_err"] <= 1e-9, d
