"""The networkx view, the Chrome trace and the PNG timeline agree with the engine."""
from __future__ import annotations

import json

import pytest

from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Simulator
from octopipe.sim.graph import critical_path, find_cycle, to_networkx
from octopipe.sim.trace import sim_timeline_png, sim_trace
from tests.sim.conftest import one_f_one_b_table


def test_longest_path_equals_strict_eager_makespan():
    sim = Simulator(one_f_one_b_table(4, 6)).uniform(1.0, 2.0, transfer=1.5)
    res = sim.run()
    length, labels = critical_path(sim.program, sim.durations)
    assert length == pytest.approx(res.makespan)
    assert labels[-1] == "0B5"
    assert res.critical_path_labels()[-1] == "0B5"
    g = to_networkx(sim.program)
    kinds = {d["type"] for _, _, d in g.edges(data=True)}
    assert kinds == {"data", "device", "link"}


def test_find_cycle_on_an_impossible_order():
    bad = ScheduleTable.from_strings([["1F0", "0F0", "1B0", "0B0"]], (0, 0), 1)
    assert find_cycle(Simulator(bad).program) is not None
    assert find_cycle(Simulator(one_f_one_b_table(3, 3)).program) is None


def test_sim_trace_has_flows_from_send_to_recv(tmp_path):
    res = Simulator(one_f_one_b_table(3, 4)).uniform(1.0, 2.0, transfer=0.5).run()
    doc = json.loads(json.dumps(sim_trace(res)))
    ev = doc["traceEvents"]
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(starts) == res.program.n_transfers == len(ends)
    for t, s in starts.items():
        assert s["pid"] == res.program.t_src[t] and ends[t]["pid"] == res.program.t_dst[t]
        assert ends[t]["ts"] >= s["ts"]
    assert sum(e["ph"] == "X" and e["tid"] == 0 for e in ev) == res.program.n_compute
    sim_timeline_png(res, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
