"""Bubble attribution: what the tuner steers by, derived from the simulator's bubble causes.

The simulator's vocabulary (`octopipe.sim.sim_result.BubbleCause`) is the project's one; the tuner
groups it into four causes per device (they sum to the device's idle time, makespan − busy):
- `imbalance`: the part of the dependency waits (`DEPENDENCY`: warm-up/cool-down, waiting
  upstream or downstream) the device would have even with a perfect schedule, because the
  busiest device has more work (max busy − this device's busy);
- `edges`: the rest of the dependency waits (filling and draining, data from other stages);
- `transfer`: `WAIT_TRANSFER`, waiting for a message after its producer has finished;
- `memory`: `MEMORY`, idle while an action of this device was already data-ready but held back
  by the in-flight limit or activation memory (or by the fixed row order).

`attribute_sim` reads them off a full simulation; `attribute` estimates the same three groups
(dependency, transfer, memory) from the list scheduler's flat arrays. This is what the tuner
steers by (`largest`) and what users read in the plan report.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from octopipe.sim.sim_result import BubbleCause, SimResult
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.listsched import ListResult

CAUSES = ("imbalance", "edges", "transfer", "memory")   # the tuner's grouping (module docstring)


@dataclass(frozen=True, eq=False)
class Attribution:
    makespan: float
    busy: np.ndarray         # [D] seconds of compute
    dependency: np.ndarray   # [D] seconds of the simulator's DEPENDENCY causes
    transfer: np.ndarray     # [D] seconds of BubbleCause.WAIT_TRANSFER
    memory: np.ndarray       # [D] seconds of BubbleCause.MEMORY

    @cached_property
    def imbalance(self) -> np.ndarray:
        return np.minimum(self.busy.max() - self.busy, self.dependency)

    @cached_property
    def edges(self) -> np.ndarray:
        return self.dependency - self.imbalance

    @property
    def idle(self) -> np.ndarray:
        return self.makespan - self.busy

    @property
    def bubble_ratio(self) -> np.ndarray:
        return self.idle / self.makespan if self.makespan > 0 else np.zeros_like(self.busy)

    def totals(self) -> dict[str, float]:
        return {c: float(getattr(self, c).sum()) for c in CAUSES}

    def largest(self) -> tuple[str, int]:
        """The cause with the most idle time over all devices, and the device it hurts most."""
        tot = self.totals()
        cause = max(CAUSES, key=lambda c: (tot[c], -CAUSES.index(c)))
        return cause, int(np.argmax(getattr(self, cause)))

    def as_dict(self) -> dict:
        return {"makespan_s": self.makespan, "busy_s": self.busy.tolist(),
                "idle_s": self.idle.tolist(), "bubble_ratio": self.bubble_ratio.tolist(),
                **{f"{c}_s": getattr(self, c).tolist() for c in CAUSES}}


def attribute(n_devices: int, device: np.ndarray, start: np.ndarray, end: np.ndarray,
              ready: np.ndarray, pred_end: np.ndarray, makespan: float | None = None) -> Attribution:
    """Attribute idle time from flat per-action arrays.

    device/start/end: where and when each compute action ran; ready: when its inputs had
    arrived (after transfers); pred_end: when its producers finished computing (before
    transfers). Both are 0 for actions without producers.
    """
    device = np.asarray(device, dtype=np.int64)
    start, end = np.asarray(start, float), np.asarray(end, float)
    ready, pred_end = np.asarray(ready, float), np.asarray(pred_end, float)
    T = float(end.max()) if makespan is None else float(makespan)
    D = n_devices
    busy = np.zeros(D)
    dependency = np.zeros(D)
    transfer = np.zeros(D)
    memory = np.zeros(D)
    np.add.at(busy, device, end - start)
    for d in range(D):
        idx = np.flatnonzero(device == d)
        if idx.size == 0:
            dependency[d] = T
            continue
        idx = idx[np.argsort(start[idx], kind="stable")]
        st, en, rd, pe = start[idx], end[idx], ready[idx], pred_end[idx]
        # earliest data-ready time among each action and every later one on the device
        later_ready = np.minimum.accumulate(rd[::-1])[::-1]
        g0 = np.concatenate([[0.0], en[:-1]])
        g1 = st
        gap = np.maximum(0.0, g1 - g0)
        # held back: the part of the gap during which a later action was already data-ready
        held_ref = np.concatenate([later_ready[1:], [np.inf]])
        held = np.minimum(gap, np.maximum(0.0, g1 - np.maximum(g0, held_ref)))
        tr = np.maximum(0.0, np.minimum(g1, rd) - np.maximum(g0, pe))
        tr = np.minimum(tr, gap - held)
        memory[d] = held.sum()
        transfer[d] = tr.sum()
        dependency[d] = (gap - held - tr).sum() + max(0.0, T - en.max())
    return Attribution(T, busy, dependency, transfer, memory)


def from_list_result(problem: Problem, cand: Candidate, result: ListResult) -> Attribution:
    """Attribution of a list-scheduler estimate (see `Problem.estimate`)."""
    arr = problem.arrays(cand)
    kinds = 3 if cand.split_backward else 2
    st = result.start[:, :kinds, :]
    dur = arr.dur[:, :kinds, None]
    en = st + dur
    ready = np.zeros_like(st)
    pend = np.zeros_like(st)
    # F(s,m) waits for F(s-1,m)
    pend[1:, 0, :] = en[:-1, 0, :]
    ready[1:, 0, :] = en[:-1, 0, :] + arr.comm_f[:-1, None]
    # I(s,m) waits for F(s,m) and I(s+1,m)
    pend[:, 1, :] = en[:, 0, :]
    ready[:, 1, :] = en[:, 0, :]
    pend[:-1, 1, :] = np.maximum(pend[:-1, 1, :], en[1:, 1, :])
    ready[:-1, 1, :] = np.maximum(ready[:-1, 1, :], en[1:, 1, :] + arr.comm_b[1:, None])
    if kinds == 3:
        pend[:, 2, :] = en[:, 1, :]
        ready[:, 2, :] = en[:, 1, :]
    dev = np.broadcast_to(arr.dev[:, None, None], st.shape)
    return attribute(problem.n_devices, dev.ravel(), st.ravel(), en.ravel(), ready.ravel(),
                     pend.ravel(), result.makespan)


def attribute_sim(sim: SimResult) -> Attribution:
    """Attribution of a full simulation, grouped from the simulator's own bubble causes."""
    return Attribution(float(sim.makespan), np.asarray(sim.busy, dtype=float), sim.dependency_wait,
                       sim.idle_for(BubbleCause.WAIT_TRANSFER), sim.idle_for(BubbleCause.MEMORY))
