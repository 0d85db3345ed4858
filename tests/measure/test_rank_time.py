"""The rank-time split on hand-made events with known numbers."""
import pytest

from octopipe.measure.rank_time import rank_profile, rank_split, transfer_seconds


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
