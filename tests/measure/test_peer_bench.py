"""The training peer bench's ceiling: a step's compute on its busiest rank, and a plan's own bubble."""
from __future__ import annotations

import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.measure.bench.peer import busiest_rank_s, work_share
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule


def test_busiest_rank_is_the_least_idle_one():
    # rank 1 idles 10% of a 0.2 s step: it computed 0.18 s, more than rank 0's 0.12 s
    assert busiest_rank_s({"idle_share": [0.4, 0.1], "step_s": 0.2}) == pytest.approx(0.18)


def test_a_rank_never_idle_computed_the_whole_step():
    assert busiest_rank_s({"idle_share": [0.0, 0.3, 0.5], "step_s": 0.125}) == pytest.approx(0.125)


def test_work_share_of_1f1b_is_its_closed_form():
    # two equal stages, F = 1 and B = 2 per stage, free transfers: 1F1B takes (m + p - 1)(F + B)
    # and each device computes m(F + B), a share of m / (m + 1)
    link = Link("free", 1e18, 0.0)
    cluster = Cluster("two", (DeviceKind("dev", 1e12, 1e12, 1e12),), (0, 0), (0, 0), link, link)
    costs = CostTable.uniform(4, f=0.5, i=0.5, w=0.5, out_bytes=0.0)
    for m in (4, 8):
        plan = Plan(Partition.uniform(4, 2), build_schedule("1f1b", 2, m), "toy")
        assert work_share(plan, costs, cluster) == pytest.approx(m / (m + 1))
