"""mode=execute's memory figures: each rank's measured bytes beside the simulator's peak."""
from __future__ import annotations

import pytest

from octopipe.cluster import Link
from octopipe.config.cost import AnalyticCost
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.modes.execute import measure
from octopipe.plan import Plan
from octopipe.runtime.job import Job
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.library import build_schedule
from tests.runtime.tiny import attn, emb, head, mamba1, mamba2, mlp, model

MODEL = model([emb(), mamba2(), attn(), mlp(), mamba1(), mlp(), head()])
KEYS = ("memory_measured_bytes", "memory_simulated_bytes", "memory_max_rel_err", "memory_simulated_replay_bytes",
        "memory_simulated_executed_bytes", "memory_executed_max_rel_err")


def _job(compute: str) -> tuple[Job, list[Plan]]:
    cluster = local_cluster(2, Link("loopback", 5e8, 1e-4))
    plans = [Plan(((0, 3), (3, 7)), build_schedule(name, 2, 4)) for name in ("1f1b", "zbh1")]
    config = RuntimeConfig(compute=compute, dispatch="strict", calibrate=False, grad_check=False, pin="false",
                           iterations=2, warmup=1, timeout_s=120.0)
    return Job(plans[0], MODEL, config,
               costs=analytic_costs(AnalyticCost(), MODEL, cluster), cluster=cluster), plans


def test_real_ranks_memory_agrees_with_the_simulated_peak_per_rank():
    """Two real ranks, 1F1B and ZB-H1 in row order: every rank's measured bytes (peak saved
    activations, kept stage tensors, parameters and gradients) within 10% of the simulator's."""
    job, plans = _job("real")
    res = measure(job, plans, lambda m: job.costs)
    for name in ("1f1b", "zbh1"):
        d = res.summary["schedules"][name]
        assert len(d["memory_measured_bytes"]) == len(d["memory_simulated_bytes"]) == 2
        assert d["memory_max_rel_err"] <= 0.10, d
        assert d["memory_measured_bytes"] == pytest.approx(d["memory_simulated_bytes"], rel=0.10)
        assert d["memory_simulated_executed_bytes"] == d["memory_simulated_bytes"]     # strict: the row's order
    one, zb = (res.summary["schedules"][n]["memory_measured_bytes"] for n in ("1f1b", "zbh1"))
    assert zb[1] > one[1]           # ZB-H1's last rank holds a micro-batch's I gradients for W
    assert {k: res.summary[k] for k in KEYS} == {k: res.summary["schedules"]["1f1b"][k] for k in KEYS}
    assert any("1f1b memory per rank (MB)" in str(line) for line in res.report)


def test_emulated_ranks_have_no_memory_figures():
    job, plans = _job("emulated")
    res = measure(job, plans[:1], lambda m: job.costs)
    assert all(res.summary[k] is None for k in KEYS)
