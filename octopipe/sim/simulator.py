"""The simulator's entry points: `Simulator` (compile once, run many) and `simulate()`.

Policies: ``strict`` runs each device's row in order (a fixed-order runtime) under eager,
rendezvous or batched communication; ``ready_first`` treats the row as a non-binding ranking
(hints ``table``, ``bf``: backward before forward, ``bfw``: I/B, then F, then deferred W) and
dispatches the best-ranked ready compute, with eager messages (arrival makes an action ready),
optionally under a per-device in-flight or memory limit, paying RRFP's TP agreement before each
task with TP collectives where the durations carry one (`octopipe.sim.agreement`).
`SimResult.executed_table()` freezes what ran into a table that `strict` reproduces.
"""
from __future__ import annotations

import gc
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, InfeasibleError
from octopipe.plan import Plan
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.agreement import charged
from octopipe.sim.deadlock import Deadlock, analyze
from octopipe.sim.durations import Durations, bind, uniform
from octopipe.sim.engine import EAGER, SEMANTICS, Raw, row_needs, run_ready_first, run_strict
from octopipe.sim.hints import HINTS, PLAN
from octopipe.sim.program import Program, compile_table
from octopipe.sim.sim_result import SimResult
from octopipe.sim.variability import Jitter, MonteCarlo, Variability

POLICIES = ("strict", "ready_first")


@lru_cache(maxsize=64)
def compile_cached(table: ScheduleTable) -> Program:
    """`compile_table`, remembered for the last tables seen (the tuner re-times the same tables)."""
    return compile_table(table)


@contextmanager
def _no_gc():
    """The engine allocates only acyclic tuples and lists: pausing the cyclic collector keeps
    its cost from growing with the live heap (run time stays linear in the actions)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _check(policy: str, semantics: str, hint: str) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"sim.policy={policy!r} is unknown; use one of {', '.join(POLICIES)}")
    if semantics not in SEMANTICS:
        raise ConfigError(f"sim.semantics={semantics!r} is unknown; use one of {', '.join(SEMANTICS)}")
    if hint not in HINTS:
        raise ConfigError(f"sim.hint={hint!r} is unknown; use one of {', '.join(HINTS)}")
    if policy == "ready_first" and semantics != EAGER:
        raise ConfigError(f"sim.policy=ready_first dispatches on message arrival (eager); "
                          f"sim.semantics={semantics} applies to strict only; set sim.semantics=eager")


@dataclass(frozen=True)
class ReadyFirst:
    """The ready-first policy: an idle device runs its best-ranked ready compute; `hint` ranks
    them (table, bf, bfw), `max_inflight` caps the micro-batches live per device (`"plan"`, the
    default: each device its own row's need, as the runtime; one value; one per device; None: no
    cap), `memory_limit` holds an admission back when it would exceed the device's
    memory (True) or the given bytes per device; `octopipe.sim.hints` defines both."""

    hint: str = "table"
    max_inflight: int | Sequence[int] | str | None = PLAN
    memory_limit: bool | Sequence[float] = False

    name: ClassVar[str] = "ready_first"


Policy = str | ReadyFirst     # "strict", "ready_first" (`ReadyFirst()`'s defaults) or a ReadyFirst


def _gated(rf: ReadyFirst | None) -> bool:
    """Whether ready-first runs under a buffer cap (its TP ranks then agree on every task)."""
    return rf is not None and (rf.max_inflight is not None or rf.memory_limit not in (False, None))


def _policy(policy: Policy) -> ReadyFirst | None:
    """None for strict, the ready-first options otherwise."""
    if isinstance(policy, ReadyFirst):
        return policy
    if policy == "ready_first":
        return ReadyFirst()
    if policy == "strict":
        return None
    raise ConfigError(f"sim.policy={policy!r} is unknown; use one of {', '.join(POLICIES)}")


class Simulator:
    """A table compiled once; `run` re-times it for any durations, policy and semantics."""

    def __init__(self, table: ScheduleTable | Plan | Program, cost: CostTable | None = None,
                 cluster: Cluster | None = None, partition: Sequence[tuple[int, int]] | None = None,
                 tokens_per_microbatch: int | None = None) -> None:
        if isinstance(table, Plan):
            partition = partition or table.partition
            table = table.table
        self.program = table if isinstance(table, Program) else compile_cached(table)
        self.durations: Durations | None = None
        if cost is not None:
            if cluster is None:
                raise ConfigError("a cost table needs a cluster to time transfers; pass cluster=")
            self.durations = bind(self.program, partition, cost, cluster, tokens_per_microbatch)

    def uniform(self, f: float = 1.0, b: float = 2.0, w: float | None = None,
                transfer: float = 0.0, act_bytes: float = 1.0) -> Simulator:
        """Use equal-stage durations (F, B or I+W, a fixed transfer time)."""
        self.durations = uniform(self.program, f, b, w, transfer, act_bytes)
        return self

    def raw(self, durations: Durations | None = None, *, policy: Policy = "strict",
            semantics: str = EAGER) -> Raw:
        rf = _policy(policy)
        _check("strict" if rf is None else rf.name, semantics, "table" if rf is None else rf.hint)
        dur = durations if durations is not None else self.durations
        if dur is None:
            raise ConfigError("no durations: pass cost= and cluster= to Simulator, or call .uniform()")
        dur = charged(dur, rf is not None, _gated(rf))
        if rf is None:
            with _no_gc():
                return run_strict(self.program, dur, semantics)
        hint, max_inflight, memory_limit = rf.hint, rf.max_inflight, rf.memory_limit
        n_d = self.program.n_devices
        caps = None
        if isinstance(max_inflight, str):
            if max_inflight != PLAN:
                raise ConfigError(f"max_inflight={max_inflight!r}: give {PLAN!r}, one value >= 1, one per "
                                  "device or None")
            caps = row_needs(self.program)
        elif max_inflight is not None:
            caps = [int(max_inflight)] * n_d if np.isscalar(max_inflight) else [int(x) for x in max_inflight]
            if len(caps) != n_d or min(caps) < 1:
                raise ConfigError(f"max_inflight={max_inflight}: give one value >= 1 (or one per device)")
        mem = None
        if memory_limit is not False and memory_limit is not None:
            mem = (dur.capacity - dur.static).tolist() if memory_limit is True else list(memory_limit)
        with _no_gc():
            return run_ready_first(self.program, dur, hint, caps, mem)

    def run(self, durations: Durations | None = None, *, policy: Policy = "strict",
            semantics: str = EAGER, jitter: Jitter | Variability | None = None,
            seed: int | np.random.Generator | None = 0, check_memory: bool = False) -> SimResult:
        """Simulate once under `policy` ("strict", or ready-first: "ready_first" or a `ReadyFirst`
        with its hint and limits); raises DeadlockError (with the cycle on the grid) if the table
        stalls, and InfeasibleError when `check_memory` and a device exceeds its capacity."""
        dur = durations if durations is not None else self.durations
        if dur is None:
            raise ConfigError("no durations: pass cost= and cluster= to Simulator, or call .uniform()")
        if jitter is not None and jitter.active:
            rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
            dur = jitter.apply(self.program, dur, rng)
        dur = charged(dur, _policy(policy) is not None, _gated(_policy(policy)))
        raw = self.raw(dur, policy=policy, semantics=semantics)
        name = "strict" if _policy(policy) is None else ReadyFirst.name
        if raw.stuck is not None:
            raise analyze(self.program, raw.stuck, semantics, name).error(self.program)
        res = result_of(self.program, dur, raw, name, semantics)
        if check_memory and res.over_capacity:
            d = res.over_capacity[0]
            raise InfeasibleError(f"device {d} peaks at {res.peak_memory[d] / 2**30:.2f} GiB, over its "
                                  f"{dur.capacity[d] / 2**30:.2f} GiB; use more stages, fewer "
                                  "micro-batches in flight, or a memory limit")
        return res

    def find_deadlock(self, semantics: str = EAGER) -> Deadlock | None:
        """The cycle of waits if the table deadlocks under strict + `semantics`, else None."""
        _check("strict", semantics, "table")
        raw = run_strict(self.program, uniform(self.program), semantics)
        return None if raw.stuck is None else analyze(self.program, raw.stuck, semantics, "strict")

    def monte_carlo(self, runs: int, jitter: Jitter | Variability, seed: int = 0, **kw) -> MonteCarlo:
        """`runs` jittered simulations from one seed; kwargs as in `run`."""
        if runs < 1:
            raise ConfigError(f"sim.monte_carlo={runs}: need at least one run")
        rng = np.random.default_rng(seed)
        spans, bubbles = np.zeros(runs), np.zeros(runs)
        for k in range(runs):
            r = self.run(jitter=jitter, seed=rng, **kw)
            spans[k], bubbles[k] = r.makespan, r.bubble_ratio
        return MonteCarlo(spans, bubbles)


def grad_sync_times(program: Program, dur: Durations, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[S] start and end of each stage's DP gradient sync: after the stage's last backward
    (overlap) or its device's last compute, one at a time per device's DP link, in the order the
    stages become ready. Nothing in the iteration waits on them, so they extend its tail only."""
    gs, n_s = dur.grad_sync, program.n_stages
    if gs is None:
        return np.zeros(0), np.zeros(0)
    bwd = program.c_kind > 0
    ready = np.zeros(n_s)
    np.maximum.at(ready, program.c_stage[bwd], end[bwd])
    dev_end = np.zeros(program.n_devices)
    np.maximum.at(dev_end, program.c_dev, end)
    placement = np.asarray(program.table.placement)
    if not gs.overlap:
        ready = dev_end[placement]
    start, stop = np.zeros(n_s), np.zeros(n_s)
    free = np.zeros(program.n_devices)
    for s in sorted(range(n_s), key=lambda k: (ready[k], k)):
        d = placement[s]
        start[s] = max(ready[s], free[d])
        stop[s] = free[d] = start[s] + gs.seconds[s]
    return start, stop


def result_of(program: Program, dur: Durations, raw: Raw, policy: str, semantics: str) -> SimResult:
    makespan = float(max(raw.end.max(initial=0.0), raw.t_end.max(initial=0.0)))
    busy = np.bincount(program.c_dev, weights=raw.end - raw.start, minlength=program.n_devices)
    gs_start, gs_end = grad_sync_times(program, dur, raw.end)
    makespan = max(makespan, float(gs_end.max(initial=0.0)))
    return SimResult(program=program, durations=dur, policy=policy, semantics=semantics,
                     start=raw.start, end=raw.end, transfer_start=raw.t_start,
                     transfer_end=raw.t_end, order=raw.order, makespan=makespan, busy=busy,
                     peak_activation_memory=raw.peak_act, memory_blocked=raw.mem_blocked,
                     grad_sync_start=gs_start, grad_sync_end=gs_end)


def simulate(plan: Plan | ScheduleTable, cost: CostTable | None = None, cluster: Cluster | None = None,
             *, partition: Sequence[tuple[int, int]] | None = None, durations: Durations | None = None,
             **kw) -> SimResult:
    """One simulation of a plan (or a table + partition) on a cost table and cluster."""
    sim = Simulator(plan, cost, cluster, partition)
    return sim.run(durations, **kw)


def find_deadlock(table: ScheduleTable | Program, semantics: str = EAGER) -> Deadlock | None:
    """Non-raising deadlock check of a table under strict order (see octopipe.sim.deadlock)."""
    return Simulator(table).find_deadlock(semantics)
