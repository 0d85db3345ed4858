"""Deadlocks under strict order: detected, reported as a cycle on the grid, never a hang."""
from __future__ import annotations

import pytest

from octopipe.errors import DeadlockError
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import ReadyFirst, Simulator, find_deadlock
from tests.sim.conftest import gpipe_table, one_f_one_b_table

# device 0 blocks in a receive for the gradient before it ever sends its activation: a deadlock
# when a receive blocks (rendezvous, batched), fine when it is only posted (eager)
RECV_TOO_EARLY = ScheduleTable.from_strings(
    [["0RECV_B0", "0F0", "0SEND_F0", "0B0"],
     ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], (0, 1), 1)

# device 1 receives micro-batch 1 before 0 while device 0 sends 0 first: fine with buffered
# sends, a deadlock when a send waits for its receive (rendezvous) or completes in a group
RECV_REVERSED = ScheduleTable.from_strings(
    [["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
     ["1RECV_F1", "1F1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1B1", "1SEND_B1"]], (0, 1), 2)


# device 0 runs micro-batch 0 forward then backward first, device 1 micro-batch 1 first: the
# computes wait for each other under every semantics
CROSSED = ScheduleTable.from_strings(
    [["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0F1", "0SEND_F1", "0RECV_B1", "0B1"],
     ["1RECV_F1", "1F1", "1B1", "1SEND_B1", "1RECV_F0", "1F0", "1B0", "1SEND_B0"]], (0, 1), 2)


def test_eager_deadlock_is_reported_with_its_cycle():
    for sem in ("eager", "rendezvous", "batched"):
        dl = find_deadlock(CROSSED, sem)
        assert dl is not None and sorted(dl.devices) == [0, 1], sem
    with pytest.raises(DeadlockError) as e:
        Simulator(CROSSED).uniform().run(semantics="eager")
    text = str(e.value)
    assert ">0B0<" in text and "1F1" in text and "device 1" in text
    implicit = find_deadlock(CROSSED.compute_only(), "eager")
    assert implicit is not None and sorted(implicit.devices) == [0, 1]


def test_blocking_receive_deadlocks_where_a_posted_one_does_not():
    assert find_deadlock(RECV_TOO_EARLY, "eager") is None
    for sem in ("rendezvous", "batched"):
        dl = find_deadlock(RECV_TOO_EARLY, sem)
        assert dl is not None and sorted(dl.devices) == [0, 1]
        assert dl.cycle[0].cell in ("0RECV_B0", "1RECV_F0")


def test_rendezvous_and_batched_deadlock_where_eager_runs():
    assert find_deadlock(RECV_REVERSED, "eager") is None
    for sem in ("rendezvous", "batched"):
        dl = find_deadlock(RECV_REVERSED, sem)
        assert dl is not None and sorted(dl.devices) == [0, 1]
        with pytest.raises(DeadlockError, match="0SEND_F0"):
            Simulator(RECV_REVERSED).uniform().run(semantics=sem)


def test_one_f_one_b_needs_batched_sends_under_rendezvous():
    # Megatron pairs send_forward with recv_backward for this reason
    t = one_f_one_b_table(4, 8)
    assert find_deadlock(t, "eager") is None
    assert find_deadlock(t, "batched") is None
    dl = find_deadlock(t, "rendezvous")
    assert dl is not None and len(dl.cycle) >= 2
    assert all(w.on_device == dl.cycle[(k + 1) % len(dl.cycle)].device for k, w in enumerate(dl.cycle))
    assert find_deadlock(gpipe_table(4, 8), "rendezvous") is None


def test_compute_order_against_data_is_a_self_wait():
    t = ScheduleTable.from_strings([["1F0", "0F0", "1B0", "0B0"]], (0, 0), 1)
    dl = find_deadlock(t, "eager")
    assert dl is not None and dl.devices == (0,)
    assert "needs 0F0, which comes later in this device's row" in dl.cycle[0].waits_for
    across = ScheduleTable.from_strings([["0B0", "0F0"], ["1F0", "1B0"]], (0, 1), 1)
    assert find_deadlock(across, "eager").devices == (0,)


def test_memory_limit_deadlock_is_raised_not_looped():
    # the cap counts micro-batches: two stages of one micro-batch on one device hold one slot
    t = ScheduleTable.from_strings([["0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1"]], (0, 0), 2)
    assert Simulator(t).uniform().run(policy=ReadyFirst(max_inflight=1)).makespan > 0
    # Chimera's two pipelines admit micro-batches in opposite orders: one slot each deadlocks
    from octopipe.schedule.library import build_schedule
    sim = Simulator(build_schedule("chimera", 2, 2)).uniform()
    assert sim.run(policy=ReadyFirst(max_inflight=2)).makespan > 0
    with pytest.raises(DeadlockError, match="in-flight"):
        sim.run(policy=ReadyFirst(max_inflight=1))
