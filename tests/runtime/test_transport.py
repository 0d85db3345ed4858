"""The ordered transport (what NCCL needs), on gloo over 127.0.0.1: canonical per-pair message
orders, exact gradients, posting order on the wire, the backend/transport/device checks, and the
pooled receive waiters."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from octopipe.errors import ScheduleError
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.runtime.messages import pair_orders
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.runtime.transport import BWD, FWD, Key, Waiters, choose_transport
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

RTOL = 1e-5

# Looped placement (stages 0, 2 on rank 0; 1, 3 on rank 1), depth first: rank 0's 0F1 is ready
# long before 2F0 (which waits for rank 1's 1F0), so ready_first produces rank 1's input of 1F1
# before that of 3F0, out of the row's order, and the ordered transport must hold it back.
DEPTH_FIRST = ScheduleTable.from_strings(
    [["0F0", "2F0", "0F1", "2F1", "2B0", "0B0", "2B1", "0B1"],
     ["1F0", "3F0", "1F1", "3F1", "3B0", "1B0", "3B1", "1B1"]],
    placement=(0, 1, 0, 1), n_microbatches=2, name="depth_first")


def test_pair_orders_follow_the_senders_row():
    """Worked by hand: F of stage s sends (s+1, FWD) to the owner of s+1, B of stage s > 0 sends
    (s-1, BWD) to the owner of s-1; the last stage's F and stage 0's B send nothing."""
    assert pair_orders(DEPTH_FIRST) == {
        (0, 1): [Key(1, 0, FWD), Key(3, 0, FWD), Key(1, 1, FWD), Key(3, 1, FWD),
                 Key(1, 0, BWD), Key(1, 1, BWD)],
        (1, 0): [Key(2, 0, FWD), Key(2, 1, FWD), Key(2, 0, BWD), Key(0, 0, BWD),
                 Key(2, 1, BWD), Key(0, 1, BWD)],
    }


def test_pair_orders_skip_messages_between_stages_on_one_rank():
    """V placement (0, 1, 1, 0), split backward: 1->2 and 2->1 stay on rank 1, I sends like B,
    W sends nothing."""
    v = ScheduleTable.from_strings(
        [["0F0", "3F0", "3I0", "3W0", "0I0", "0W0"],
         ["1F0", "2F0", "2I0", "1I0", "2W0", "1W0"]],
        placement=(0, 1, 1, 0), n_microbatches=1)
    assert pair_orders(v) == {(0, 1): [Key(1, 0, FWD), Key(2, 0, BWD)],
                              (1, 0): [Key(3, 0, FWD), Key(0, 0, BWD)]}


def test_pair_orders_place_chimera_replicas_per_microbatch():
    table = build_schedule("chimera", 2, 2)
    orders = pair_orders(table)
    for (src, dst), keys in orders.items():
        for k in keys:
            producer = k.stage - 1 if k.direction == FWD else k.stage + 1
            assert table.device_of(producer, k.microbatch) == src
            assert table.device_of(k.stage, k.microbatch) == dst
    crossings = sum(1 for s in range(table.n_stages - 1) for m in range(2)
                    if table.device_of(s, m) != table.device_of(s + 1, m))
    assert table.replicas and crossings > 0
    assert sum(len(v) for v in orders.values()) == 2 * crossings   # one F and one B message each


def run_ordered(model, table, dispatch, partition=None):
    partition = partition or uniform_partition(model.n_layers, table.n_stages)
    got = execute(tiny.job(model, partition, table, dispatch=dispatch, transport="ordered", timeout_s=60,
                           stall_s=20))
    ref = reference_run(model, table.n_microbatches)
    assert max_rel_err(got.grads, ref.grads) <= RTOL
    assert got.losses[0] == pytest.approx(ref.losses[0], rel=RTOL)
    return got


@pytest.mark.parametrize("dispatch", ["strict", "ready_first"])
def test_ordered_transport_is_exact(dispatch):
    """1F1B and ZB-V (split backward, V placement) on 2 ranks, an irregular random table on 3."""
    run_ordered(tiny.dense(2), build_schedule("1f1b", 2, 3), dispatch)
    run_ordered(tiny.dense(2), build_schedule("zbv", 2, 3), dispatch)
    run_ordered(tiny.hybrid(), random_table(n_devices=3, n_stages=5, n_microbatches=3, seed=4), dispatch)


def test_ordered_sender_posts_in_canonical_order_and_holds_early_messages():
    got = run_ordered(tiny.dense(2), DEPTH_FIRST, "ready_first")
    orders = pair_orders(DEPTH_FIRST)
    ran = [e["action"] for e in got.events[0] if "action" in e]
    assert ran.index("0F1") < ran.index("2F0")      # produced out of the row's order ...
    held = []
    for src, events in enumerate(got.events):
        sends = [e for e in events if "send" in e]
        for dst in range(2):
            posted = [Key(*e["send"]) for e in sends if e["dst"] == dst]
            assert posted == orders.get((src, dst), [])
        held += [Key(*e["send"]) for e in sends if e["held"]]
    assert Key(1, 1, FWD) in held                    # ... so 1F1's input waited for 3F0's


def test_transport_and_device_choices():
    assert choose_transport("gloo") == ("tagged", "cpu")
    assert choose_transport("nccl", cuda_available=True) == ("ordered", "cuda")
    assert choose_transport("gloo", "ordered", "cuda", cuda_available=True) == ("ordered", "cuda")
    with pytest.raises(ScheduleError, match="NCCL matches messages by order; use transport=ordered or auto"):
        choose_transport("nccl", "tagged", cuda_available=True)
    with pytest.raises(ScheduleError, match="device=cpu with backend=nccl"):
        choose_transport("nccl", "auto", "cpu", cuda_available=True)
    with pytest.raises(ScheduleError, match="backend=nccl needs CUDA devices and this machine has none"):
        choose_transport("nccl", cuda_available=False)
    with pytest.raises(ScheduleError, match="device=cuda but CUDA is not available"):
        choose_transport("gloo", "auto", "cuda", cuda_available=False)


def test_execute_rejects_bad_choices_before_starting_ranks():
    model, table = tiny.dense(1), build_schedule("1f1b", 2, 2)
    part = uniform_partition(model.n_layers, 2)
    with pytest.raises(ScheduleError, match=r"runtime.transport='fifo': choose one of auto, tagged, ordered"):
        execute(tiny.job(model, part, table, transport="fifo"))
    with pytest.raises(ScheduleError, match=r"runtime.device='tpu': choose one of auto, cpu, cuda"):
        execute(tiny.job(model, part, table, device="tpu"))
    with pytest.raises(ScheduleError, match=r"runtime.backend='mpi'"):
        execute(tiny.job(model, part, table, backend="mpi"))
    if not torch.cuda.is_available():
        with pytest.raises(ScheduleError, match="device=cuda but CUDA is not available"):
            execute(tiny.job(model, part, table, device="cuda"))


def test_local_nccl_needs_a_gpu_per_rank(monkeypatch):
    """Seen on one H200: two NCCL ranks on one GPU fail with 'Duplicate GPU detected'; the
    launcher says so before starting any rank."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    model = tiny.dense(1)
    with pytest.raises(ScheduleError, match="backend=nccl needs a GPU per rank: the job has 2 ranks"):
        execute(tiny.job(model, uniform_partition(model.n_layers, 2), build_schedule("1f1b", 2, 2),
                         backend="nccl"))


def test_pooled_waiters_never_queue_one_receive_behind_another_and_are_reused():
    """Eight blocked jobs released in reverse order all finish (each had a thread of its own),
    and a second round of eight starts no new thread."""
    pool = Waiters()
    for _ in range(2):
        gates = [threading.Event() for _ in range(8)]
        finished = []
        done = threading.Semaphore(0)

        def job(k):
            gates[k].wait(timeout=10)
            finished.append(k)
            done.release()
        for k in range(8):
            pool.submit(lambda k=k: job(k))
        for g in reversed(gates):
            g.set()
            assert done.acquire(timeout=10)
        assert finished == list(range(7, -1, -1))
        deadline = time.monotonic() + 10        # each thread marks itself idle after its job
        while pool.idle < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert pool.started == 8 and pool.idle == 8
