"""Bubble attribution: each device's idle time split by cause.

Causes, per device (they sum to the device's idle time, makespan − busy):
- `imbalance`: idle the device would have even with a perfect schedule, because the busiest
  device has more work (max busy − this device's busy);
- `edges`: waiting for the pipeline to fill or drain and for data from other stages
  (warm-up/cool-down and dependency bubbles), beyond the imbalance share;
- `transfer`: waiting for a message after its producer has finished (exposed communication);
- `memory`: idle while an action of this device was already data-ready but held back by the
  in-flight limit or activation memory (or by the fixed row order).

This is what the tuner steers by (`largest`) and what users read in the plan report.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAUSES = ("imbalance", "edges", "transfer", "memory")


@dataclass(frozen=True, eq=False)
class Attribution:
    makespan: float
    busy: np.ndarray         # [D] seconds of compute
    imbalance: np.ndarray    # [D] seconds
    edges: np.ndarray
    transfer: np.ndarray
    memory: np.ndarray

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
    edges = np.zeros(D)
    transfer = np.zeros(D)
    memory = np.zeros(D)
    np.add.at(busy, device, end - start)
    for d in range(D):
        idx = np.flatnonzero(device == d)
        if idx.size == 0:
            edges[d] = T
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
        edges[d] = (gap - held - tr).sum() + max(0.0, T - en.max())
    imbalance = np.minimum(busy.max() - busy, edges)
    edges = edges - imbalance
    return Attribution(T, busy, imbalance, edges, transfer, memory)


def from_list_result(problem, cand, result) -> Attribution:
    """Attribution of a list-scheduler estimate (see `Problem.estimate`)."""
    arr = problem.arrays(cand)
    S, M = arr.n_stages, problem.n_microbatches
    kinds = 3 if cand.split else 2
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


def attribute_sim(sim) -> Attribution:
    """Attribution of a full simulation, reusing the simulator's own bubble causes.

    The simulator splits idle time into warm-up/cool-down, waiting upstream, waiting
    downstream, waiting for a transfer and memory; the first three are dependency bubbles, of
    which the imbalance share (max busy − busy) is reported as imbalance.
    """
    from octopipe.sim.result import CAUSES as SIM_CAUSES
    bc = np.asarray(sim.bubble_causes)
    col = {c: k for k, c in enumerate(SIM_CAUSES)}
    busy = np.asarray(sim.busy, dtype=float)
    dep = bc[:, col["warmup_cooldown"]] + bc[:, col["wait_upstream"]] + bc[:, col["wait_downstream"]]
    imbalance = np.minimum(busy.max() - busy, dep)
    return Attribution(float(sim.makespan), busy, imbalance, dep - imbalance,
                       bc[:, col["wait_transfer"]].copy(), bc[:, col["memory"]].copy())
