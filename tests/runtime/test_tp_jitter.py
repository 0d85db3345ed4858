"""Real-compute jitter does extra work in proportion to the work an action did (its CPU time),
not its wall time: the TP ranks of a stage run the same work but wait in their all-reduces for
different times, and must do the same extra work, as one device would."""
from __future__ import annotations

import time

import torch

from octopipe.runtime.jitter import Jittered, busy_work
from octopipe.sim.variability import Variability

CPU = torch.device("cpu")


class WaitsThenComputes:
    """A compute whose forward only waits (as a rank does in a collective) and whose backward
    only computes (30 ms of this thread's CPU time)."""

    def start_iteration(self, iteration: int) -> None:
        pass

    def forward(self, stage: int, mb: int, x):
        time.sleep(0.05)
        return x

    def backward(self, stage: int, mb: int, grad):
        busy_work(0.03, CPU, time.thread_time)
        return grad


def test_extra_work_follows_the_cpu_time_of_the_action():
    slow = Variability(slow_rank=0, slow_rank_factor=3.0, floor=1.0)    # every action on rank 0: x3
    j = Jittered(WaitsThenComputes(), slow, 0, 0, (1, 1), CPU)
    j.start_iteration(0)
    c0 = time.thread_time()
    j.forward(0, 0, None)
    assert time.thread_time() - c0 < 0.05     # the wait is not work: no 2 x 50 ms of extra CPU time
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # all the work on this thread, so its CPU clock sees all of it
    try:
        c0 = time.thread_time()
        j.backward(0, 0, None)
        spent = time.thread_time() - c0
    finally:
        torch.set_num_threads(threads)
    # 30 ms of work, then 2 x 30 more: each busy loop stops within one small product of its target
    assert 0.09 <= spent <= 0.09 * 1.25
    assert [f for *_, f in j.factors] == [3.0, 3.0]
