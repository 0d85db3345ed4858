"""A killed rank is always the headline, wherever it dies; a frozen rank is the one the watchdog names."""
from __future__ import annotations

import os
import random
import signal
import sys
import threading

import pytest

from octopipe.errors import RuntimeExecutionError
from octopipe.plan import uniform_partition
from octopipe.runtime.job import Fault
from octopipe.runtime.launch import execute
from octopipe.schedule.library import build_schedule
from tests.reliability.procs import forked_ranks, wait_until
from tests.runtime import tiny

MODEL = tiny.hybrid()
TABLE = build_schedule("1f1b", 3, 3)
PARTITION = uniform_partition(MODEL.n_layers, 3)


def kills(n: int, seed: int) -> list[tuple[str, Fault]]:
    """`n` random (dispatch, SIGKILL of a rank at one of its actions) cases, the issue's own first."""
    rng = random.Random(seed)
    out = [("ready_first", Fault(2, "2B0", "exit"))]
    while len(out) < n:
        r = rng.randrange(TABLE.n_devices)
        out.append((rng.choice(["strict", "ready_first"]), Fault(r, str(rng.choice(TABLE.actions(r))), "exit")))
    return out


def run_killed(dispatch: str, fault: Fault) -> str:
    with pytest.raises(RuntimeExecutionError) as info:
        execute(tiny.job(MODEL, PARTITION, TABLE, fault=fault, dispatch=dispatch, timeout_s=60))
    return str(info.value)


@pytest.mark.parametrize("dispatch, fault", kills(3, seed=18), ids=lambda x: str(getattr(x, "action", x)))
def test_a_killed_rank_is_the_headline(dispatch, fault):
    msg = run_killed(dispatch, fault)
    head = msg.splitlines()[0]
    assert head.startswith(f"rank {fault.rank} was killed by SIGKILL at {fault.action} (iteration 0"), msg
    assert "Connection closed" not in head and "None" not in head
    assert "Traceback" not in msg                    # survivors' tracebacks are not the story


@pytest.mark.slow
@pytest.mark.parametrize("dispatch, fault", kills(24, seed=81)[1:], ids=lambda x: str(getattr(x, "action", x)))
def test_a_killed_rank_is_the_headline_at_random_actions(dispatch, fault):
    head = run_killed(dispatch, fault).splitlines()[0]
    assert head.startswith(f"rank {fault.rank} was killed by SIGKILL at {fault.action} (iteration 0"), head


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_watchdog_names_a_stopped_rank():
    """Rank 1 SIGSTOPped mid-run: every other rank waits on it; the watchdog says it is rank 1."""
    me = os.getpid()
    ranks: list[int] = []

    def stop_rank_1():
        # the forkserver's children are the ranks, forked in rank order
        if wait_until(lambda: len(forked_ranks(me)) >= 3, timeout=120):
            wait_until(lambda: False, timeout=0.5)
            ranks.extend(forked_ranks(me)[-3:])
            os.kill(ranks[1], signal.SIGSTOP)

    t = threading.Thread(target=stop_rank_1, daemon=True)
    t.start()
    with pytest.raises(RuntimeExecutionError) as info:
        execute(tiny.job(MODEL, PARTITION, TABLE, iterations=100000, timeout_s=120, stall_s=2.0))
    t.join(5)
    msg = str(info.value)
    assert ranks, "the ranks were not found"
    assert msg.startswith("watchdog: no rank made progress for"), msg
    assert "rank 1 stopped responding (no heartbeat for" in msg.splitlines()[0], msg
    assert "its process is stopped" in msg
