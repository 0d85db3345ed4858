"""Failures end the run quickly, name the rank and the action, and never hang."""
from __future__ import annotations

import pytest

from octopipe.errors import RuntimeExecutionError, ScheduleError
from octopipe.plan import uniform_partition
from octopipe.runtime.job import Fault
from octopipe.runtime.launch import execute
from octopipe.schedule.table import ScheduleTable
from tests.runtime import tiny

MODEL = tiny.dense(2)
TABLE = ScheduleTable.from_strings([[f"{d}{k}{m}" for k in "FB" for m in range(3)] for d in range(3)],
                                   (0, 1, 2), 3, "gpipe")


def run_with(fault: Fault, **kw) -> str:
    """The launch's error; the message itself tells a failure reported at once from one that
    waited for the 60 s timeout (which names runtime.timeout_s), with no clock in the assertion."""
    with pytest.raises(RuntimeExecutionError) as info:
        execute(tiny.job(MODEL, uniform_partition(MODEL.n_layers, 3), TABLE, fault=fault, timeout_s=60, **kw))
    assert "exceeded runtime.timeout_s" not in str(info.value)
    return str(info.value)


def test_a_raising_rank_stops_everyone_and_is_named_with_its_action():
    msg = run_with(Fault(rank=1, action="1F1", kind="raise"))
    assert msg.startswith("rank 1 failed at 1F1") and "injected fault at 1F1" in msg
    assert "rank 0:" in msg and "rank 2:" in msg


def test_a_killed_rank_is_reported_not_waited_for():
    msg = run_with(Fault(rank=2, action="2B0", kind="exit"))
    assert msg.startswith("rank 2 was killed by SIGKILL at 2B0")


def test_watchdog_turns_a_stuck_rank_into_an_error_with_every_position():
    msg = run_with(Fault(rank=0, action="0F2", kind="hang"), stall_s=1.5)
    assert msg.startswith("watchdog: no rank made progress")
    assert "rank 0: running 0F2" in msg
    assert "rank 1: waiting for the inputs of" in msg


def test_bad_plans_are_rejected_before_any_process_starts():
    bad = ScheduleTable.from_strings([["0B0", "0F0"], ["1F0", "1B0"]], (0, 1), 1)
    with pytest.raises(ScheduleError, match="0B0 comes before 0F0"):
        execute(tiny.job(MODEL, uniform_partition(MODEL.n_layers, 2), bad))
    good = ScheduleTable.from_strings([["0F0", "0B0"], ["1F0", "1B0"]], (0, 1), 1)
    with pytest.raises(ScheduleError, match="partition covers 5 layers"):
        execute(tiny.job(MODEL, ((0, 2), (2, 5)), good))
    with pytest.raises(ScheduleError, match="partition has 1 stages but the table places 2"):
        execute(tiny.job(MODEL, ((0, 5),), good))
    with pytest.raises(ScheduleError, match="runtime.dispatch='eager'"):
        execute(tiny.job(MODEL, uniform_partition(MODEL.n_layers, 2), good, dispatch="eager"))
