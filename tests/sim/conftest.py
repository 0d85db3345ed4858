"""Hand-written table builders for the simulator tests (independent of the named generators)."""
from __future__ import annotations

import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.table import ScheduleTable

F, B = ActionKind.F, ActionKind.B


def gpipe_table(p: int, m: int) -> ScheduleTable:
    rows = [[Action(d, F, j) for j in range(m)] + [Action(d, B, j) for j in range(m)] for d in range(p)]
    return ScheduleTable.from_rows(rows, range(p), m, "gpipe")


def one_f_one_b_table(p: int, m: int) -> ScheduleTable:
    rows = []
    for d in range(p):
        warm = min(p - d - 1, m)
        row = [Action(d, F, j) for j in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                row.append(Action(d, F, f))
                f += 1
            row.append(Action(d, B, b))
            b += 1
        rows.append(row)
    return ScheduleTable.from_rows(rows, range(p), m, "1f1b")


def make_cluster(n: int, bandwidth: float = 1.0, latency: float = 0.0, per_node: int | None = None,
                 memory: float = 1e12, peak: float = 1e12) -> Cluster:
    per_node = per_node or n
    link = Link("link", bandwidth, latency)
    return Cluster("test", (DeviceKind("dev", peak, memory, 1e12),), (0,) * n,
                   tuple(r // per_node for r in range(n)), link, link)


@pytest.fixture
def cluster4() -> Cluster:
    return make_cluster(4)
