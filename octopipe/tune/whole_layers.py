"""A search over whole layers beside the search over pieces.

Cutting heavy layers into pieces widens the search space, and with the same budget the search
over pieces can end in a slower plan than a search that cuts nothing (llama3_8b, pp = 8, 32
micro-batches: 3.658 s with pieces, 3.613 s without). So when the planner cuts layers, the search
over whole layers runs too, with the same budgets and starts as `tuner.split_layers=off` (the
ILPs' partitions aside), and its best plans join the finalists: the plan chosen is not slower
than what that search finds. A quarter of the budget was not enough on that case (3.638 s).

The two searches share nothing, so `WholeLayersBeside` runs this one in a forked process while
the search over pieces runs: on two cores the tuner takes about the time of the longer search
instead of the sum. Its plans are the same as in the caller (same inputs, seed and budgets,
which are counted in evaluations); where fork is unavailable, or the child dies, the search runs
in the caller when its plans are asked for.
"""
from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from octopipe.config.tuner import TunerConfig
from octopipe.errors import InfeasibleError
from octopipe.plan import Plan
from octopipe.tune.baselines import as_candidate
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import Evaluated
from octopipe.tune.freeze import to_plan
from octopipe.tune.levers import Levers, reference
from octopipe.tune.search import SearchConfig, search

SHARE = 1          # the whole-layer search gets 1/SHARE of the search's budgets


def whole_layer_plans(whole: Problem, baselines: Sequence[Evaluated], cfg: TunerConfig,
                      seed: int, left_s: float, model: str = "") -> list[Plan]:
    """The best distinct whole-layer plans (up to half the finalists) of a search with the same
    budgets, from the feasible baselines and S-1F1B."""
    levers = Levers.of([x for x in cfg.levers if x != "split_layers"], reference(whole.n_layers, whole.n_devices))
    scfg = replace(SearchConfig.of(cfg), max_evaluations=max(1, cfg.max_evaluations // SHARE),
                   max_work=max(1, cfg.max_work // SHARE), time_budget_s=left_s)
    starts = [as_candidate(b) for b in baselines if b.feasible and levers.conforms(as_candidate(b))]
    try:
        out = search(whole, [*starts, levers.ref], scfg, seed, pool_size=max(2, cfg.finalists), levers=levers)
    except InfeasibleError:     # nothing fits over whole layers: the pieces' finalists stand
        return []
    finals, seen = [], set()
    for est, cand in out.pool:
        if len(finals) >= max(1, cfg.finalists // 2):
            break
        plan = levers.frozen_table(to_plan(whole, cand, model=model,
                                           meta={"origin": f"tuned over whole layers from {cand.origin or 'seed'}",
                                                 "estimate_s": est, "candidate": cand.describe()}))
        key = (plan.partition, plan.table.rows)
        if key not in seen:
            seen.add(key)
            finals.append(plan)
    return finals


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class WholeLayersBeside:
    """`whole_layer_plans(*args)` in a child forked on entering (see the module); `plans()`
    waits for them, `close()` stops a child whose plans were never asked for. Inactive (`args`
    None: nothing is cut into pieces) it gives no plans."""

    args: tuple | None
    _pid: int = field(default=0, init=False)
    _fd: int = field(default=-1, init=False)

    def __enter__(self) -> WholeLayersBeside:
        """Fork the child. Stop signals are blocked from just before the fork until the child is
        recorded (and, in the child, until it ignores Ctrl-C), so a Ctrl-C never leaves a child
        unknown to `close` nor runs the caller's handlers in the child."""
        if self.args is None or not hasattr(os, "fork"):
            return self
        r, w = os.pipe()
        held = None
        try:
            held = signal.pthread_sigmask(signal.SIG_BLOCK, ())    # a Ctrl-C already pending raises here
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
            pid = _fork()
            if pid == 0:
                _child(r, w, self.args)
            self._pid, self._fd = max(pid, 0), r
        finally:
            os.close(w)
            if not self._pid:
                os.close(r)
            try:
                if held is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, held)   # a held Ctrl-C is raised here
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def plans(self) -> list[Plan]:
        if self.args is None:
            return []
        got = None
        if self._pid:
            with os.fdopen(self._fd, "rb") as f:
                data = f.read()
            os.waitpid(self._pid, 0)
            self._pid = 0
            got = pickle.loads(data) if data else None
        if got is None:             # no fork here, or the child died: the same search in the caller
            return whole_layer_plans(*self.args)
        if isinstance(got, BaseException):
            raise got
        return got

    def close(self) -> None:
        if self._pid:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            os.close(self._fd)
            self._pid = 0


def _fork() -> int:
    """`os.fork()`, or -1 where the system refuses one (the search then runs in the caller)."""
    try:
        return os.fork()
    except OSError:
        return -1


def _child(r: int, w: int, args: tuple) -> None:
    """The forked child: the plans (or the exception) pickled to the parent, then exit at once
    (no clean-up of the parent's state). Ctrl-C is the parent's to handle; a stop signal just
    ends the child."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        os.close(r)
        try:
            out: object = whole_layer_plans(*args)
        except Exception as e:      # raised in the parent, as in a search run there
            out = e
        try:
            data = pickle.dumps(out)
        except Exception:           # unpicklable: the parent runs the search itself
            data = b""
        with os.fdopen(w, "wb") as f:
            f.write(data)
    finally:
        os._exit(0)
