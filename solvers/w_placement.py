"""Exact placement of the weight-gradient passes (W) of a split-backward table, under an
activation budget per device (a MILP, PuLP).

The order of every device's F and I actions is fixed; the ILP chooses, for each W, the gap of its
device's row it runs in (after its own I), and hence the times of everything. Zero-bubble's memory
model: F allocates its stage's `act` bytes when it starts, I frees `act - wact` when it ends, W
frees `wact`. Memory rises only when an F starts, so the budget is checked there.

Variables: x[w, k] = 1 when W w runs in gap k of its device (gap k: just before the k-th F/I
action, gap n: after the last); S[a] the start of each F/I action; T the makespan. Constraints:
each W in one gap at or after the one following its I; per device, an action starts after the
one before it and the Ws of the gap between them; data dependencies across devices with the
boundary delays; T after every device's last action and trailing Ws; the budget at every F. The
minimal T is the makespan of the ASAP (strict row order) run of the best placement, so with free
links it equals the simulator's; Ws in a gap run in (micro-batch, stage) order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pulp

from octopipe.config.solver import SolverConfig
from octopipe.schedule.action import Action, ActionKind
from solvers.backend import run_model

F, I, W = ActionKind.F, ActionKind.I, ActionKind.W


@dataclass(frozen=True)
class WInstance:
    """A split-backward table's rows and what timing them needs (per stage unless said)."""

    rows: tuple[tuple[Action, ...], ...]
    f: np.ndarray
    i: np.ndarray
    w: np.ndarray
    comm_f: np.ndarray          # delay of stage s's activations reaching s + 1
    comm_b: np.ndarray          # delay of stage s's input gradient reaching s - 1
    act: np.ndarray             # bytes F stores
    wact: np.ndarray            # of them, bytes W still needs after I
    budget: np.ndarray          # [device] activation bytes (inf: none)

    def dur(self, a: Action) -> float:
        return float({F: self.f, I: self.i, W: self.w}[a.kind][a.stage])


@dataclass(frozen=True)
class WPlacement:
    rows: tuple[tuple[Action, ...], ...]   # the table's rows with the Ws placed
    makespan: float                        # the ILP's T
    proven_optimal: bool
    status: str
    time_capped: bool = False              # stopped by the solver's time limit


def _gaps(row: tuple[Action, ...]) -> tuple[list[Action], dict[Action, int]]:
    """The row's F/I actions in order, and for each W the first gap it may take."""
    core = [a for a in row if a is not None and a.kind != W]
    pos = {a: k for k, a in enumerate(core)}
    first = {a: pos[Action(a.stage, I, a.microbatch)] + 1
             for a in row if a is not None and a.kind == W}
    return core, first


def place_ws(inst: WInstance, cfg: SolverConfig | None = None) -> WPlacement:
    """The W placement of least makespan within the budget (see the module docstring); idle
    cells (None) of the rows are dropped."""
    cfg = cfg or SolverConfig()
    prob = pulp.LpProblem("w_placement", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=0)
    prob += T
    start: dict[Action, pulp.LpVariable] = {}
    x: dict[tuple[Action, int], pulp.LpVariable] = {}
    layout = []
    for d, row in enumerate(inst.rows):
        core, first = _gaps(row)
        n = len(core)
        for a in core:
            start[a] = prob.add_variable(f"S_{d}_{a}", lowBound=0)
        ws = sorted(first, key=lambda a: (a.microbatch, a.stage))
        for a in ws:
            for k in range(first[a], n + 1):
                x[a, k] = prob.add_variable(f"x_{a}_{k}", cat="Binary")
            prob += pulp.lpSum(x[a, k] for k in range(first[a], n + 1)) == 1
        gap = [pulp.lpSum(inst.dur(a) * x[a, k] for a in ws if (a, k) in x) for k in range(n + 1)]
        for k in range(1, n):
            prob += start[core[k]] >= start[core[k - 1]] + inst.dur(core[k - 1]) + gap[k]
        if n:
            prob += start[core[-1]] + inst.dur(core[-1]) + gap[n] <= T
        held = 0.0               # in units of the budget (bytes are too large for the solver)
        unit = float(inst.budget[d]) if np.isfinite(inst.budget[d]) and inst.budget[d] > 0 else 0.0
        for k, a in enumerate(core):
            if a.kind == F:
                if unit:
                    freed_w = pulp.lpSum(float(inst.wact[b.stage]) / unit * x[b, j]
                                         for b in ws for j in range(first[b], k + 1) if (b, j) in x)
                    prob += held + float(inst.act[a.stage]) / unit - freed_w <= 1.0 + 1e-9
                held += float(inst.act[a.stage]) / unit if unit else 0.0
            elif unit:
                held -= float(inst.act[a.stage] - inst.wact[a.stage]) / unit
        layout.append((core, ws, first))
    last = len(inst.f) - 1
    for a, sa in start.items():
        s, m = a.stage, a.microbatch
        if a.kind == F and s > 0:
            prob += sa >= start[Action(s - 1, F, m)] + float(inst.f[s - 1] + inst.comm_f[s - 1])
        if a.kind == I:
            prev = Action(s, F, m) if s == last else Action(s + 1, I, m)
            delay = inst.f[s] if s == last else inst.i[s + 1] + inst.comm_b[s + 1]
            prob += sa >= start[prev] + float(delay)
    out = run_model(prob, cfg)
    if not out.has_solution:
        return WPlacement(inst.rows, float("inf"), False, out.status.lower(), out.time_capped)
    rows = []
    for core, ws, first in layout:
        in_gap: dict[int, list[Action]] = {}
        for a in ws:
            k = next(k for k in range(first[a], len(core) + 1) if x[a, k].value() > 0.5)
            in_gap.setdefault(k, []).append(a)
        row: list[Action] = []
        for k in range(len(core) + 1):
            row += in_gap.get(k, [])
            if k < len(core):
                row.append(core[k])
        rows.append(tuple(row))
    return WPlacement(tuple(rows), float(T.value()), out.proven_optimal, out.status.lower(),
                      out.time_capped)
