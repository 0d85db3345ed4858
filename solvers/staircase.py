"""The staircase encoding of contiguous partitions shared by the ILPs.

`z[s, j] = 1` iff layer j lies in stages 0..s (s < S-1; the last stage takes the rest). Rows
are monotone (`z[s, j] >= z[s, j+1]`) and every stage is non-empty (`z[s+1, j+1] >= z[s, j]`);
cells that the non-empty rule (or a window on a stage's end, see `reach_windows`) already
decides are constants. Then, with prefix sums folded in,
everything a stage costs is linear in z:

- layer j is in stage s  iff  `z[s, j] - z[s-1, j] = 1`, so a stage's work on kind c is
  `sum_j c[j] (z[s, j] - z[s-1, j])` (same for static and activation bytes);
- stage s ends at layer j  iff  `z[s, j] - z[s, j+1] = 1`, so the bytes on boundary s are
  `sum_j out[j] (z[s, j] - z[s, j+1])`.

(S-1)(L-S+1) binaries, 2 (S-1) L constraints; its LP relaxation is the fractional
partition, which is tight enough that CBC proves optimality by a few hundred nodes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pulp

Expr = pulp.LpAffineExpression


def _const(c: pulp.LpVariable | int, value: int) -> bool:
    return isinstance(c, int) and c == value


class Staircase:
    """Binary staircase variables for `n_stages` contiguous stages over `n_layers` layers."""

    def __init__(self, prob: pulp.LpProblem, n_layers: int, n_stages: int, prefix: str = "z",
                 windows: Sequence[tuple[int, int]] | None = None):
        self.L, self.S = n_layers, n_stages
        # windows[s] = (min, max) of the end of stage s: z[s, j] = 1 below min, 0 from max on
        self.windows = list(windows) if windows is not None else [
            (s + 1, n_layers - (n_stages - 1 - s)) for s in range(n_stages - 1)]
        self.var: dict[tuple[int, int], pulp.LpVariable] = {}
        for s in range(n_stages - 1):
            for j in range(n_layers):
                if self.fixed(s, j) is None:
                    self.var[s, j] = prob.add_variable(f"{prefix}_{s}_{j}", cat=pulp.LpBinary)
        for (s, j), v in self.var.items():
            nxt, up = self.cell(s, j + 1), self.cell(s + 1, j + 1)
            prev = self.cell(s, j - 1) if j > 0 else 1
            down = self.cell(s - 1, j - 1) if j > 0 else 0
            if not _const(nxt, 0):
                prob += v >= nxt, f"{prefix}_mono_{s}_{j}"
            if not _const(up, 1):
                prob += up >= v, f"{prefix}_nonempty_{s}_{j}"
            if _const(down, 1):
                prob += v >= 1, f"{prefix}_after_{s}_{j}"
            if _const(prev, 0):
                prob += v <= 0, f"{prefix}_before_{s}_{j}"

    def fixed(self, s: int, j: int) -> int | None:
        """The constant value of z[s, j] where non-emptiness decides it, else None."""
        if s < 0 or j >= self.L:
            return 0
        if s >= self.S - 1:
            return 1
        lo, hi = self.windows[s]
        if j < lo:
            return 1
        if j >= hi:
            return 0
        return None

    def cell(self, s: int, j: int) -> pulp.LpVariable | int:
        c = self.fixed(s, j)
        return c if c is not None else self.var[s, j]

    def _expr(self, terms: Iterable[tuple[float, int, int]]) -> Expr:
        coef: dict[pulp.LpVariable, float] = {}
        const = 0.0
        for w, s, j in terms:
            if w == 0.0:
                continue
            c = self.cell(s, j)
            if isinstance(c, pulp.LpVariable):
                coef[c] = coef.get(c, 0.0) + w
            else:
                const += w * c
        return pulp.LpAffineExpression([(v, w) for v, w in coef.items() if w != 0.0], const)

    def stage_terms(self, s: int, per_layer: Sequence[float], scale: float = 1.0
                    ) -> list[tuple[float, int, int]]:
        """Terms of `sum_j per_layer[j] * [layer j in stage s]`."""
        out = []
        for j in range(self.L):
            w = float(per_layer[j]) * scale
            if w:
                out.append((w, s, j))
                out.append((-w, s - 1, j))
        return out

    def boundary_terms(self, s: int, per_layer: Sequence[float], scale: float = 1.0
                       ) -> list[tuple[float, int, int]]:
        """Terms of `per_layer[last layer of stage s]` (s < S-1)."""
        out = []
        for j in range(self.L):
            w = float(per_layer[j]) * scale
            if w:
                out.append((w, s, j))
                out.append((-w, s, j + 1))
        return out

    def expr(self, terms: Iterable[tuple[float, int, int]], const: float = 0.0) -> Expr:
        e = self._expr(terms)
        e.constant += const
        return e

    def bounds(self) -> list[int]:
        """Solved stage ends (exclusive) of stages 0..S-2."""
        out = []
        for s in range(self.S - 1):
            row = [self.cell(s, j) for j in range(self.L)]
            vals = np.array([c if isinstance(c, int) else (c.value() or 0.0) for c in row])
            out.append(int(np.sum(vals > 0.5)))
        return out


def reach_windows(stage_work: Callable[[int, int, int], float], n_layers: int, n_stages: int,
                  bound: float) -> list[tuple[int, int]] | None:
    """For each stage s < S-1, the range its end can take in any partition whose stages each
    cost at most `bound` (`stage_work(s, lo, hi)` is a lower bound on stage s's cost).

    Forward: stages 0..s, each stretched as far as the bound allows, reach at most `max`;
    backward: stages S-1..s+1 likewise leave at least `min` layers to the first s+1 stages.
    With `bound` = a known plan's objective this removes every z that cannot change the optimum.
    None when no partition meets the bound.
    """
    L, S = n_layers, n_stages
    tol = bound * (1 + 1e-9) + 1e-15
    fwd, pos = [], 0
    for s in range(S - 1):
        hi = pos + 1
        while hi < L and stage_work(s, pos, hi + 1) <= tol:
            hi += 1
        pos = hi
        fwd.append(min(pos, L - (S - 1 - s)))
    bwd, pos = [0] * (S - 1), L
    for s in range(S - 1, 0, -1):
        lo = pos - 1
        while lo > 0 and stage_work(s, lo - 1, pos) <= tol:
            lo -= 1
        pos = lo
        bwd[s - 1] = max(pos, s)
    if any(b > f for b, f in zip(bwd, fwd)):
        return None
    return list(zip(bwd, fwd))
