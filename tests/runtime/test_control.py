"""The launcher's shared state: a rank stopped at any moment cannot block the launcher's abort
(a rank stopped while it held a shared lock used to hang the launcher's teardown)."""
from __future__ import annotations

import os
import signal
import sys
import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import SemLock

import pytest
import torch.multiprocessing as mp

from octopipe.runtime.control import Control

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP")


def _locks(obj, depth: int = 3) -> list[SemLock]:
    """Every SemLock reachable from `obj`'s attributes, but the error queue's: only the launcher
    reads the queue, and without blocking."""
    if isinstance(obj, SemLock):
        return [obj]
    if depth == 0 or isinstance(obj, Queue) or not hasattr(obj, "__dict__"):
        return []
    return [lock for v in vars(obj).values() for lock in _locks(v, depth - 1)]


def _hold_every_lock_and_stop(control: Control, ready) -> None:
    for lock in _locks(control):
        lock.acquire(False)
    control.report(1, 3, 2, 1, True)
    ready.send(len(_locks(control)))
    os.kill(os.getpid(), signal.SIGSTOP)


def _returns(fn, timeout: float) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def test_a_rank_stopped_at_any_moment_cannot_block_the_abort():
    ctx = mp.get_context("spawn")
    control = Control(2, ctx)
    here, there = ctx.Pipe()
    p = ctx.Process(target=_hold_every_lock_and_stop, args=(control, there))
    p.start()
    try:
        assert here.poll(120), "the rank never started"
        here.recv()
        assert _returns(control.aborted, 10) and not control.aborted()
        assert _returns(control.abort, 10), "abort blocked on a lock the stopped rank holds"
        assert control.aborted()
        assert control.status(1) == (3, 2, 1, True, False)
        assert _returns(lambda: (control.snapshot(), control.beats(), control.failures()), 10)
    finally:
        p.kill()
        p.join(30)
