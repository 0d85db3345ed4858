"""The layout search: enumerate, bound, estimate, tune the promising, report the best.

1. enumerate the feasible (tp, pp, dp, micro-batch size, count) (`octopipe.layout.space`);
2. order them by the compute lower bound and estimate each with the named schedules at the
   least recomputation that fits (memory floor first), skipping a layout whose lower bound
   cannot beat the best estimate so far;
3. tune the `layout.tuned` best-estimated layouts (skipping one whose lower bound cannot beat
   the best tuned so far), per-stage recomputation chosen under memory;
4. the best is the shortest simulated iteration of all (tuned or estimated); ties go to the
   layout first in order. `layout.exhaustive` estimates and tunes every feasible layout instead
   (the oracle).

Every step is clock-free and seeded, so a seed gives one result.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from octopipe.config.cost import AnalyticCost
from octopipe.config.layout import LayoutConfig
from octopipe.cost.collectives import static_bytes_per_param
from octopipe.errors import InfeasibleError
from octopipe.layout.evaluate import Evaluation, LayoutEvaluator
from octopipe.layout.rank_grid import Grid
from octopipe.layout.space import Layout, enumerate_layouts
from octopipe.model.params import layer_params
from octopipe.model.spec import ModelSpec

Progress = Callable[[str, float, float], None]


def _quiet(case: str, done: float, total: float) -> None:
    """No progress shown."""


@dataclass
class LayoutSearch:
    """What the search found: the best evaluation, all evaluations ranked, and its counts."""

    best: Evaluation
    ranked: list[Evaluation]
    layouts: int                      # feasible layouts enumerated
    candidates_evaluated: int         # layouts simulated (estimated or tuned)
    tuned: int
    pruned: int                       # skipped by the lower bound
    infeasible: int                   # no recomputation level fits memory
    notes: list[str] = field(default_factory=list)

    def top(self, k: int) -> list[Evaluation]:
        return self.ranked[:k]


def _key(ev: Evaluation) -> tuple:
    return (round(ev.iteration_s, 12), ev.layout)


def search(model: ModelSpec, grid: Grid, cost: AnalyticCost, cfg: LayoutConfig, seed: int = 0,
           progress: Progress = _quiet) -> LayoutSearch:
    """Lay `model` out on `grid` for `cfg.global_batch` sequences; InfeasibleError when no
    layout fits memory (saying what would)."""
    ev = LayoutEvaluator(model, grid, cost, cfg, seed)
    layouts = enumerate_layouts(model, grid.n_gpus, grid.gpus_per_node, cfg)
    bounds = {L: ev.lower_bound(L) for L in layouts}
    order = sorted(layouts, key=lambda L: (bounds[L], L))
    total = len(order) + (len(order) if cfg.exhaustive else cfg.tuned)
    done = 0.0
    estimates: dict[Layout, tuple[Evaluation, str]] = {}
    best_est, pruned, infeasible = math.inf, 0, 0
    for L in order:
        progress(f"estimate {L.label()}", done, total)
        done += 1
        if not cfg.exhaustive and bounds[L] >= best_est:
            pruned += 1
            continue
        got = ev.estimate(L)
        if got is None:
            infeasible += 1
            continue
        estimates[L] = got
        best_est = min(best_est, got[0].iteration_s)
    if not estimates:
        raise InfeasibleError(_what_would_fit(model, grid, cost, cfg, layouts))
    tuned: dict[Layout, Evaluation] = {}
    queue = sorted(estimates, key=lambda L: _key(estimates[L][0]))
    cap = len(queue) if cfg.exhaustive else cfg.tuned
    best_tuned = math.inf
    for L in queue[:cap]:
        progress(f"tune {L.label()}", done, total)
        done += 1
        if not cfg.exhaustive and bounds[L] >= min(best_tuned, best_est):
            pruned += 1
            continue
        got = ev.tune(L, estimates[L][1], estimates[L][0])
        if got is not None:
            tuned[L] = got
            best_tuned = min(best_tuned, got.iteration_s)
    progress("done", total, total)
    ranked = sorted([*tuned.values(), *(e for L, (e, _) in estimates.items() if L not in tuned)],
                    key=_key)
    return LayoutSearch(ranked[0], ranked, len(layouts), len(estimates) + len(tuned), len(tuned),
                        pruned, infeasible)


def _what_would_fit(model: ModelSpec, grid: Grid, cost: AnalyticCost, cfg: LayoutConfig,
                    layouts: list[Layout]) -> str:
    """One line: the model fits no layout, and what would (more GPUs, ZeRO, recomputation)."""
    params = sum(layer_params(x) for x in model.layers)
    cap = min(grid.gpus.kinds[k].memory_bytes for k in set(grid.gpus.device_kind))
    now = params * static_bytes_per_param(cost.bytes_per_param, 1, 0, cost.grad_bytes)
    need = math.ceil(now / cap)
    hints = [f"at least {need} GPUs of {cap / 1e9:.0f} GB (the weights, gradients and optimizer "
             f"state alone take {now / 1e9:.0f} GB without ZeRO)"] if need > grid.n_gpus else []
    options = (("full recomputation (layout.recompute=[none,selective,full])", cfg.zero, "full"),
               ("layout.zero=2", 2, cfg.recompute[-1] if cfg.recompute else "none"),
               ("layout.zero=2 with full recomputation", 2, "full"))
    for text, zero, level in options:
        if zero == cfg.zero and level in cfg.recompute:
            continue                                    # what was already tried
        lean = LayoutEvaluator(model, grid, cost, replace(cfg, zero=zero, recompute=(level,)))
        fits = [L for L in layouts if lean.fits_floor(L, level)]
        if fits:
            hints.append(f"{text} (e.g. {fits[0].label()} then passes the memory floor)")
            break
    else:
        hints.append("ZeRO-2 and full recomputation do not suffice here")
    hints.append("a smaller micro-batch size")
    return (f"{model.name} fits no layout on {grid.n_gpus} GPUs ({len(layouts)} layouts tried, "
            f"global batch {cfg.global_batch}); would fit with: {'; '.join(hints)}")
