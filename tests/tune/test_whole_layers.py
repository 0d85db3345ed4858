"""The whole-layer search run beside the search over pieces, in a forked child: the same plans as
run in the caller, its errors raised in the caller, and no child left behind."""
import os
import signal
import threading

import pytest

from octopipe.config.tuner import TunerConfig
from octopipe.tune import Problem
from octopipe.tune.baselines import run_baselines
from octopipe.tune.whole_layers import WholeLayersBeside, whole_layer_plans

from .helpers import free_cluster
from .test_splitting import head_heavy

CFG = TunerConfig(time_budget_s=600, max_iters=12, patience=4, ilp=False, max_evaluations=300)


def args():
    costs, cl = head_heavy(), free_cluster(4, memory_bytes=2**34, latency=1e-5, bandwidth=50e9)
    whole = Problem.build(costs, cl, 4, 8)
    return whole, run_baselines(whole, "head_heavy"), CFG, 0, 600.0, "head_heavy"


def children() -> list[int]:
    path = f"/proc/{os.getpid()}/task/{os.getpid()}/children"
    return [int(x) for x in open(path).read().split()] if os.path.exists(path) else []


def test_the_forked_search_gives_the_plans_of_the_search_in_the_caller():
    a = args()
    here = whole_layer_plans(*a)
    with WholeLayersBeside(a) as beside:
        assert beside._pid in children()
        got = beside.plans()
    assert [(p.partition, p.placement, p.table.rows, p.meta["estimate_s"]) for p in got] == \
        [(p.partition, p.placement, p.table.rows, p.meta["estimate_s"]) for p in here]
    assert len(got) >= 1 and beside._pid == 0


def test_an_error_in_the_child_is_raised_in_the_caller():
    whole, baselines, _, seed, left, model = args()
    with WholeLayersBeside((whole, baselines, "not a config", seed, left, model)) as beside, \
            pytest.raises(AttributeError):
        beside.plans()


def test_a_child_whose_plans_are_never_asked_for_is_stopped():
    with WholeLayersBeside(args()) as beside:
        pid = beside._pid
        assert pid in children()
    assert pid not in children() and beside._pid == 0


def test_inactive_gives_no_plans_and_forks_nothing():
    before = children()
    with WholeLayersBeside(None) as beside:
        assert beside.plans() == [] and children() == before


def test_a_ctrl_c_during_the_fork_reaches_the_caller_and_leaves_no_child(monkeypatch):
    """The Ctrl-C is held while the child starts, then raised in the caller, which stops the
    child; the caller's signal mask is as before."""
    real_fork, forked = os.fork, []

    def fork_then_ctrl_c() -> int:
        pid = real_fork()
        if pid:     # to this thread: another thread of the test process must not take it
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            forked.append(pid)
        return pid
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)   # an earlier test may ignore it
    monkeypatch.setattr(os, "fork", fork_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt), WholeLayersBeside(args()):
            pass
    finally:
        signal.signal(signal.SIGINT, handler)
    assert forked and forked[0] not in children()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before
