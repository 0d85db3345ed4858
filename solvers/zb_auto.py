"""An independent oracle: zero-bubble's automatic scheduler (Qi et al. 2024, ZB-1p / ZB-2p).

Written from the behaviour of its `zb.py` heuristic, not from its code: one stage per device,
split backward (B = input gradient, W = weight gradient), F allocates `mem_f`, B frees all but
`mem_w`, W frees `mem_w`; every stage holds at most `max_mem` (p·M_F is ZB-1p, 2p·M_F ZB-2p).

- Micro-batch 0: every stage runs F0, then as many extra forwards as fit in memory and in the
  time until B0's gradient comes back (counted from the last stage down), kept strictly
  decreasing along the pipeline; then B0 runs from the last stage to the first.
- Each later micro-batch: every stage that still has forwards runs one F (never more than its
  successor), then B from the last stage to the first. Before each F and B a stage runs
  pending Ws while they fit the wait for its input, and more Ws when memory is short.
- Its own timing: an action starts when its device is free and its input has arrived (the
  producer's end plus `comm`); its comparisons of times allow 1e-9 of the longest pass, so
  that costs summed in another order make the same choices. Several greedy variants are tried; the one with the smallest
  "cost" (the longest stage's time from its first start to its last end, the paper's measure)
  is kept.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from octopipe.errors import InfeasibleError

F_, B_, W_ = 0, 1, 2


@dataclass(frozen=True)
class ZbInstance:
    """Per-stage times (s) and bytes; `max_mem` per stage; `comm` the link delay (s)."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    w: tuple[float, ...]
    mem_f: tuple[float, ...]
    mem_w: tuple[float, ...]
    max_mem: tuple[float, ...]
    comm: float
    n_microbatches: int

    @property
    def n_stages(self) -> int:
        return len(self.f)


@dataclass(frozen=True)
class ZbSchedule:
    """Per stage, the (kind, micro-batch) order with each action's start and end time."""

    rows: tuple[tuple[tuple[int, int], ...], ...]
    start: np.ndarray     # [kind, stage, mb]
    end: np.ndarray       # [kind, stage, mb]
    peak_mem: np.ndarray  # [stage]

    @property
    def stage_spans(self) -> np.ndarray:
        return self.end.max(axis=(0, 2)) - self.start.min(axis=(0, 2))

    @property
    def cost(self) -> float:
        """The paper's schedule cost: the largest stage span."""
        return float(self.stage_spans.max())

    @property
    def makespan(self) -> float:
        return float(self.end.max() - self.start.min())


class _State:
    """The greedy builder's running state (counts, clocks, memory, per-stage idle)."""

    def __init__(self, inst: ZbInstance):
        p, m = inst.n_stages, inst.n_microbatches
        self.inst = inst
        self.count = np.zeros((3, p), dtype=int)
        self.clock = np.zeros(p)
        self.mem = np.zeros(p)
        self.peak = np.zeros(p)
        self.idle = np.zeros(p)
        self.start = np.zeros((3, p, m))
        self.end = np.zeros((3, p, m))
        self.rows: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        self.tol = 1e-9 * max(max(inst.f), max(inst.b), max(inst.w))   # ties despite rounding

    def cost(self, kind: int, s: int) -> float:
        return (self.inst.f, self.inst.b, self.inst.w)[kind][s]

    def delta(self, kind: int, s: int) -> float:
        i = self.inst
        return (i.mem_f[s], i.mem_w[s] - i.mem_f[s], -i.mem_w[s])[kind]

    def ready(self, kind: int, s: int) -> float:
        """When the input of the stage's next `kind` action is there."""
        p, mb, c = self.inst.n_stages, self.count[kind, s], self.inst.comm
        if kind == F_ and s > 0:
            return self.end[F_, s - 1, mb] + c
        if kind == B_ and s < p - 1:
            return self.end[B_, s + 1, mb] + c
        if kind == B_:
            return self.end[F_, s, mb]
        return 0.0

    def put(self, s: int, kind: int) -> None:
        mb = int(self.count[kind, s])
        t0 = max(self.clock[s], self.ready(kind, s))
        if self.count[F_, s] > 0:
            self.idle[s] += t0 - self.clock[s]
        self.start[kind, s, mb], self.end[kind, s, mb] = t0, t0 + self.cost(kind, s)
        self.clock[s] = t0 + self.cost(kind, s)
        self.mem[s] += self.delta(kind, s)
        self.peak[s] = max(self.peak[s], self.mem[s])
        self.count[kind, s] += 1
        self.rows[s].append((kind, mb))

    def pending_w(self, s: int) -> bool:
        return self.count[W_, s] < self.count[B_, s]

    def free_for(self, s: int, kind: int) -> None:
        """Run Ws until the next `kind` action fits the stage's memory."""
        while self.mem[s] + self.delta(kind, s) > self.inst.max_mem[s] * (1 + 1e-9):
            if not self.pending_w(s):
                raise InfeasibleError(f"zero-bubble scheduler: stage {s} cannot fit its next "
                                      f"{'FBW'[kind]} in {self.inst.max_mem[s]:.4g} bytes")
            self.put(s, W_)

    def fill_wait(self, s: int, kind: int, greedy: bool) -> None:
        """Run Ws that end before the input arrives; one more into a partial gap when `greedy`
        or when the gap is larger than the pipeline's worst idle so far."""
        arrive, tol = self.ready(kind, s), self.tol
        while self.pending_w(s) and self.clock[s] + self.cost(W_, s) <= arrive + tol:
            self.put(s, W_)
        if self.pending_w(s) and self.clock[s] < arrive - tol and \
                (greedy or arrive - self.clock[s] > self.idle.max() - self.idle[s] + tol):
            self.put(s, W_)


def _warmup(st: _State, before_first_b: bool) -> np.ndarray:
    """Extra forwards per stage before B0 (micro-batch 0's F already placed)."""
    inst, p, m = st.inst, st.inst.n_stages, st.inst.n_microbatches
    extra = np.zeros(p, dtype=int)
    back = st.end[F_, p - 1, 0] + inst.b[p - 1]
    for s in range(p - 2, -1, -1):
        mem, clock = st.mem[s], st.clock[s]
        while 1 + extra[s] < m and mem + inst.mem_f[s] <= inst.max_mem[s] * (1 + 1e-9):
            over = clock + inst.f[s] > back + inst.comm + st.tol if before_first_b else \
                clock >= back + inst.comm - st.tol
            if over:
                break
            mem, clock = mem + inst.mem_f[s], clock + inst.f[s]
            extra[s] += 1
        back = max(clock, back + inst.comm) + inst.b[s]
    for s in range(1, p):
        while extra[s] > 0 and extra[s] >= extra[s - 1]:
            extra[s] -= 1
    return extra


def _build(inst: ZbInstance, before_first_b: bool, greedy: bool) -> ZbSchedule:
    p, m = inst.n_stages, inst.n_microbatches
    st = _State(inst)
    for s in range(p):
        st.free_for(s, F_)
        st.put(s, F_)
    for s, k in enumerate(_warmup(st, before_first_b)):
        for _ in range(int(k)):
            st.put(s, F_)
    for mb in range(m):
        if mb > 0:
            want = st.count[F_] < m
            for s in range(p - 2, -1, -1):
                want[s] = want[s] and want[s + 1]
            for s in range(p):
                if want[s]:
                    st.free_for(s, F_)
                    if s > 0:
                        st.fill_wait(s, F_, greedy)
                    st.put(s, F_)
        for s in range(p - 1, -1, -1):
            st.free_for(s, B_)
            if s < p - 1:
                st.fill_wait(s, B_, greedy)
            if s == 0 and st.count[F_, 0] == m:
                while st.pending_w(s):
                    st.put(s, W_)
            st.put(s, B_)
    for s in range(p):
        while st.pending_w(s):
            st.put(s, W_)
    return ZbSchedule(tuple(tuple(r) for r in st.rows), st.start, st.end, st.peak)


def zb_auto_schedule(inst: ZbInstance) -> ZbSchedule:
    """The best of the greedy variants by the paper's cost (ties: smaller makespan)."""
    best, best_key = None, None
    for before_first_b, greedy in itertools.product((True, False), (True, False)):
        try:
            sched = _build(inst, before_first_b, greedy)
        except InfeasibleError:
            continue
        key = (round(sched.cost, 12), round(sched.makespan, 12))
        if best is None or key < best_key:
            best, best_key = sched, key
    if best is None:
        raise InfeasibleError("zero-bubble scheduler: no variant fits the memory limit "
                              f"{min(inst.max_mem):.4g} bytes")
    return best
