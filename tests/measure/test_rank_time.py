"""The rank-time split on hand-made events with known numbers."""
import numpy as np
import pytest

from octopipe.measure.rank_time import host_seconds, rank_profile, rank_split, transfer_seconds
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import Simulator


def _rank0():
    return [
        {"it": 0, "action": "F0", "start": 0.0, "end": 5.0},               # warm-up, not kept
        {"it": 0, "begin": 0.0, "finish": 10.0, "cpu_s": 5.0, "dispatch_us": 100.0},
        {"it": 1, "action": "F0", "start": 10.0, "end": 11.0},
        {"it": 1, "action": "B0", "start": 12.0, "end": 14.0},
        {"it": 1, "begin": 10.0, "finish": 14.0, "cpu_s": 3.5, "dispatch_us": 500.0},
        {"it": 1, "send": (0, 0, 0), "dst": 1, "start": 11.0, "bytes": 8},
    ]


def _rank1():
    return [
        {"it": 1, "action": "F0", "start": 11.5, "end": 12.0},
        {"it": 1, "begin": 10.0, "finish": 14.0, "cpu_s": None, "dispatch_us": None},
        {"it": 1, "recv": (0, 0, 0), "end": 11.25},
    ]


def test_split_of_one_rank():
    r = rank_split(_rank0(), [1])
    assert r["span_s"] == pytest.approx(4.0)
    assert r["compute_s"] == pytest.approx(3.0)
    assert r["dispatch_s"] == pytest.approx(2 * 500e-6) and r["dispatch_us"] == 500.0
    assert r["waiting_s"] == pytest.approx(4.0 - 3.0 - 1e-3)
    assert r["idle_share"] == pytest.approx(0.25)
    assert r["cpu_beyond_compute_s"] == pytest.approx(0.5)


def test_no_cpu_record_and_no_kept_iteration():
    r = rank_split(_rank1(), [1])
    assert r["cpu_beyond_compute_s"] is None and r["dispatch_s"] == 0.0
    assert rank_split(_rank1(), [0])["span_s"] is None


def test_transfers_match_send_and_arrival():
    events = [_rank0(), _rank1()]
    assert transfer_seconds(events, [1]) == [pytest.approx(0.25)]
    assert transfer_seconds(events, [0]) == []
    p = rank_profile(events, [1])
    assert p["transport_us"] == pytest.approx(250000.0) and p["messages"] == 1
    assert p["dispatch_us"] == 500.0                 # rank 1 recorded no decision
    assert p["idle_share"] == pytest.approx((0.25 + 0.875) / 2)


def test_host_seconds_is_each_actions_span_beyond_its_modelled_duration():
    """Two iterations, each with its own modelled durations: the host time is the mean excess of
    the actions of those iterations, warm-up and unknown iterations left out."""
    sim = Simulator(build_schedule("1f1b", 2, 2).compute_only())
    sim.uniform(f=1.0, b=2.0)
    p, base = sim.program, sim.durations
    name = [str(p.action(c)) for c in range(p.n_compute)]
    durs = {1: base, 2: base.scaled(compute=base.compute * 2)}
    events = [[{"it": it, "action": name[c], "start": 10.0 * it, "end": 10.0 * it + durs[it].compute[c] + extra}
               for c in range(p.n_compute) for it, extra in ((1, 1e-3), (2, 3e-3))]
              + [{"it": 0, "action": name[0], "start": 0.0, "end": 9.0}, {"it": 1, "begin": 0.0, "finish": 1.0}]]
    assert host_seconds(events, p, durs) == pytest.approx(2e-3, rel=1e-9)
    assert host_seconds(events, p, {}) is None
    assert np.all(durs[2].compute == 2 * base.compute)
