"""One layout, costed and planned: its CostTables (analytic, with TP collectives, ZeRO memory
and each recomputation level), its cheap bounds, an estimate from the named schedules, a plan
from the tuner, per-stage recomputation chosen under memory, and the simulated iteration with
each stage's DP gradient sync on its device's timeline.

Bounds: the memory floor (every parameter, gradient and optimizer byte, plus one micro-batch's
activations of every layer, must fit the pipeline's memory together) and the compute lower
bound (`m` micro-batches of the whole model's F + I + W without recomputation on the fastest
kind, spread evenly over the pp ranks): no plan of the layout beats it.

Per-stage recomputation: the tuner plans at the least recomputation level (uniform) under which
a named schedule fits memory; then, stage by stage (device by device for plans of many stages),
the plan's recomputation is lowered wherever the simulated peak still fits and the iteration
gets shorter. The forward recomputed under `full` or `selective` is charged inside the stage's
input-gradient pass, before its backward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from octopipe.config.cost import AnalyticCost
from octopipe.config.layout import LayoutConfig
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.cost.collectives import dp_sync_seconds
from octopipe.cost.table import CostTable
from octopipe.errors import DeadlockError, InfeasibleError
from octopipe.layout.rank_grid import Grid
from octopipe.layout.space import Layout
from octopipe.model.spec import ModelSpec
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.durations import with_grad_sync
from octopipe.sim.sim_result import SimResult
from octopipe.sim.simulator import Simulator
from octopipe.tune import TuneOptions, tune
from octopipe.tune.baselines import run_baselines
from octopipe.tune.candidate import Problem
from octopipe.tune.freeze import candidate_of, to_plan

LEVELS = ("none", "selective", "full")


@dataclass(frozen=True)
class Evaluation:
    """A layout's simulated iteration and its figures; `how`: tuned, estimated (the best named
    schedule) or the schedule a hand layout names."""

    layout: Layout
    recompute: tuple[str, ...]        # per stage
    iteration_s: float
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    bubble_ratio: float
    tp_exposed_s: float
    dp_exposed_s: float
    lower_bound_s: float
    how: str
    schedule: str
    plan: Plan | None = None
    sim: SimResult | None = None

    def recompute_value(self) -> str | list[str]:
        """One level when every stage shares it, else the level of each stage."""
        return self.recompute[0] if len(set(self.recompute)) == 1 else list(self.recompute)

    def row(self) -> dict:
        """summary.json's layout record."""
        L = self.layout
        return {"tp": L.tp, "pp": L.pp, "dp": L.dp, "micro_batch_size": L.micro_batch_size,
                "microbatches": L.microbatches, "recompute": self.recompute_value(),
                "iteration_s": self.iteration_s, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "peak_memory_bytes": self.peak_memory_bytes,
                "bubble_ratio": self.bubble_ratio, "tp_exposed_s": self.tp_exposed_s,
                "dp_exposed_s": self.dp_exposed_s, "lower_bound_s": self.lower_bound_s,
                "how": self.how, "schedule": self.schedule,
                "n_stages": len(self.plan.partition) if self.plan is not None else 0}


class LayoutEvaluator:
    """Costs, bounds, estimates and plans of the layouts of one model on one grid (cached)."""

    def __init__(self, model: ModelSpec, grid: Grid, cost: AnalyticCost, cfg: LayoutConfig,
                 seed: int = 0, semantics: str = "eager") -> None:
        self.model, self.grid, self.cfg, self.seed, self.semantics = model, grid, cfg, seed, semantics
        self.base = AnalyticCostModel.of(cost)
        self.levels = tuple(r for r in LEVELS if r in cfg.recompute) or ("none",)
        self._costs = lru_cache(maxsize=None)(self._build)

    # -- costs and bounds ---------------------------------------------------------------------

    def _build(self, layout: Layout, level: str, collectives: bool = True) -> CostTable:
        g = self.grid
        cm = replace(self.base, tp=layout.tp, dp=layout.dp, zero=self.cfg.zero, recompute=level,
                     sequence_parallel=self.cfg.sequence_parallel, tp_overlap=self.cfg.tp_overlap,
                     tp_collectives=collectives and self.base.tp_collectives,
                     tp_link="intra" if layout.tp <= g.gpus_per_node else "inter")
        model = replace(self.model, micro_batch_size=layout.micro_batch_size)
        return cm.table(model, g.pipeline(layout))

    def costs(self, layout: Layout, level: str, collectives: bool = True) -> CostTable:
        return self._costs(layout, level, collectives)

    def fits_floor(self, layout: Layout, level: str) -> bool:
        """The memory floor: static bytes plus one micro-batch of every layer's activations
        within the pipeline's memory."""
        c = self.costs(layout, level)
        cl = self.grid.pipeline(layout)
        have = sum(cl.kind_of(r).memory_bytes for r in range(cl.n_devices))
        return float(c.static_bytes.sum() + c.act_bytes.sum()) <= have

    def lower_bound(self, layout: Layout) -> float:
        """No plan of `layout` is faster: all work without recomputation, evenly on pp ranks."""
        c = self.costs(layout, self.levels[0])
        return float(layout.microbatches * c.work.min(axis=1).sum() / layout.pp)

    # -- plans --------------------------------------------------------------------------------

    def estimate(self, layout: Layout) -> tuple[Evaluation, str] | None:
        """The best named schedule (uniform and DP-balanced partitions) at the least
        recomputation that fits, with that level; None when no level fits."""
        cl = self.grid.pipeline(layout)
        tried: CostTable | None = None
        for level in self.levels:
            costs = self.costs(layout, level)
            if tried is not None and _same(costs, tried):
                continue             # selective = none under flash attention: nothing to drop
            tried = costs
            if not self.fits_floor(layout, level):
                continue
            problem = Problem.build(costs, cl, layout.pp, layout.microbatches, self.semantics)
            ok = [b for b in run_baselines(problem, self.model.name) if b.feasible]
            if ok:
                best = min(ok, key=lambda b: b.makespan_s)
                return self.finish(layout, best.plan, (level,) * len(best.plan.partition),
                                   "estimated", best.name), level
        return None

    def tune(self, layout: Layout, level: str, fallback: Evaluation | None = None) -> Evaluation | None:
        """The tuner's plan at `level` (a small, clock-free budget, searched at up to
        `layout.tune_microbatches` micro-batches and list-scheduled at the layout's count),
        recomputation then lowered per stage where memory allows; `fallback` (the estimate)
        when it is faster; None when nothing fits."""
        cfg = self.cfg
        tuner = dict(time_budget_s=600.0, max_iters=cfg.tune_iters, patience=cfg.tune_iters,
                     polish_sims=0, ilp=False, finalists=2, smt_max_actions=1, split_layers="off",
                     max_chunks=cfg.tune_chunks)
        costs, cl = self.costs(layout, level), self.grid.pipeline(layout)
        m_tune = min(layout.microbatches, cfg.tune_microbatches)
        try:
            res = tune(costs, cl, layout.pp, m_tune, TuneOptions(
                tuner, semantics=self.semantics, seed=self.seed, model=self.model.name))
        except InfeasibleError:
            return fallback
        plan = res.plan if m_tune == layout.microbatches else self.rescale(layout, costs, res.plan)
        if plan is None:
            return fallback
        levels = self.relax(layout, plan, (level,) * len(plan.partition))
        got = self.finish(layout, plan, levels, "tuned", str(plan.meta.get("candidate", "octopipe")))
        if got.sim.over_capacity:
            return fallback
        return got if fallback is None or got.iteration_s <= fallback.iteration_s else \
            replace(fallback, how="tuned")

    def rescale(self, layout: Layout, costs: CostTable, plan: Plan) -> Plan | None:
        """The tuned policy of `plan` (searched at fewer micro-batches) list-scheduled at the
        layout's count; None for a plan without a policy (a named schedule won) or that does not
        complete."""
        if plan.policy is None:
            return None
        cand = candidate_of(plan, plan.policy)
        problem = Problem.build(costs, self.grid.pipeline(layout), layout.pp, layout.microbatches,
                                self.semantics)
        try:
            return to_plan(problem, cand, model=self.model.name,
                           meta={**plan.meta, "tuned_at_microbatches": plan.table.n_microbatches})
        except InfeasibleError:
            return None

    def fixed(self, layout: Layout, schedule: str, chunks: int | None, level: str) -> Evaluation | None:
        """A hand layout: the named schedule on even stages at one recomputation level (None
        when it does not fit memory or deadlocks)."""
        table = build_schedule(schedule, layout.pp, layout.microbatches, chunks=chunks)
        plan = Plan(Partition.uniform(self.model.n_layers, table.n_stages), table,
                    model=self.model.name, meta={"origin": f"hand: {schedule}"})
        try:
            ev = self.finish(layout, plan, (level,) * table.n_stages, "hand", table.name)
        except DeadlockError:
            return None
        return ev if not ev.sim.over_capacity else None

    # -- per-stage recomputation and the iteration ----------------------------------------------

    def mixed(self, layout: Layout, plan: Plan, levels: tuple[str, ...],
              collectives: bool = True) -> CostTable:
        """The CostTable whose stage s runs at `levels[s]`."""
        which = np.zeros(self.model.n_layers, dtype=np.int64)
        for (lo, hi), lv in zip(plan.partition, levels):
            which[lo:hi] = LEVELS.index(lv)
        used = sorted(set(which.tolist()))
        tables = {k: self.costs(layout, LEVELS[k], collectives) for k in used}
        if len(used) == 1:
            return tables[used[0]]
        t0 = tables[used[0]]

        def pick(name: str) -> np.ndarray:
            arrs = [getattr(tables.get(k, t0), name) for k in range(len(LEVELS))]
            return np.choose(which[:, None] if arrs[0].ndim == 2 else which, arrs)
        return CostTable(t0.layer_names, t0.kinds, pick("f"), pick("i"), pick("w"),
                         pick("act_bytes"), t0.static_bytes, t0.out_bytes, t0.params,
                         w_act_bytes=pick("w_act_bytes"), flops=t0.flops,
                         tokens_per_microbatch=t0.tokens_per_microbatch)

    def simulate(self, layout: Layout, plan: Plan, levels: tuple[str, ...],
                 collectives: bool = True) -> Simulator:
        return Simulator(plan, self.mixed(layout, plan, levels, collectives),
                         self.grid.pipeline(layout))

    def relax(self, layout: Layout, plan: Plan, levels: tuple[str, ...]) -> tuple[str, ...]:
        """Lower each stage's (or, for plans of many stages, each device's) recomputation while
        the plan still fits memory and gets faster."""
        cur = list(levels)
        best = self._run(layout, plan, tuple(cur))
        if best is None:
            return levels
        placement = list(plan.placement)
        units = ([[s] for s in range(len(cur))] if len(cur) <= 16 else
                 [[s for s, d in enumerate(placement) if d == dev] for dev in sorted(set(placement))])
        for unit in units:
            for lv in self.levels:
                if LEVELS.index(lv) >= LEVELS.index(cur[unit[0]]):
                    break
                trial = list(cur)
                for s in unit:
                    trial[s] = lv
                res = self._run(layout, plan, tuple(trial))
                if res is not None and res < best * (1 - 1e-12):
                    cur, best = trial, res
                    break
        return tuple(cur)

    def _run(self, layout: Layout, plan: Plan, levels: tuple[str, ...]) -> float | None:
        """Makespan of `plan` at `levels` when it fits memory and runs; else None."""
        try:
            r = self.simulate(layout, plan, levels).run(policy="strict", semantics=self.semantics)
        except DeadlockError:
            return None
        return None if r.over_capacity else float(r.makespan)

    def grad_sync(self, layout: Layout, plan: Plan, costs: CostTable) -> np.ndarray:
        """[S] seconds of each stage's DP gradient sync on its device's DP link."""
        out = np.zeros(len(plan.partition))
        for s, (lo, hi) in enumerate(plan.partition):
            link = self.grid.dp_link(layout, int(plan.placement[s]))
            if link is not None:
                piece = float(costs.params[lo:hi].sum()) / layout.tp
                out[s] = dp_sync_seconds(piece, layout.dp, link, self.cfg.zero, self.base.grad_bytes,
                                         self.base.collective_algorithm)
        return out

    def finish(self, layout: Layout, plan: Plan, levels: tuple[str, ...], how: str,
               schedule: str) -> Evaluation:
        """The iteration of `plan` with per-stage `levels`: TP collectives inside F and I, each
        stage's gradient sync at the end; the exposed TP and DP time against the same plan
        without them."""
        costs = self.mixed(layout, plan, levels)
        sim = Simulator(plan, costs, self.grid.pipeline(layout))
        bare = sim.run(policy="strict", semantics=self.semantics)
        sync = self.grad_sync(layout, plan, costs)
        full = sim.run(with_grad_sync(sim.durations, sync, self.cfg.dp_overlap), policy="strict",
                       semantics=self.semantics)
        no_tp = self.simulate(layout, plan, levels, collectives=False).run(
            policy="strict", semantics=self.semantics) if layout.tp > 1 else bare
        t = float(full.makespan)
        gpus = self.grid.pipeline(layout)
        peak = sum(gpus.kind_of(r).peak_flops for r in range(layout.pp)) * layout.tp * layout.dp
        model_flops = 3.0 * float(costs.flops.sum()) * layout.microbatches * layout.dp
        tokens = layout.dp * layout.microbatches * costs.tokens_per_microbatch
        return Evaluation(layout, tuple(levels), t, tokens / t, model_flops / (t * peak),
                          float(np.max(full.peak_memory)), float(full.bubble_ratio),
                          float(bare.makespan - no_tp.makespan), float(t - bare.makespan),
                          self.lower_bound(layout), how, schedule, plan, full)


def _same(a: CostTable, b: CostTable) -> bool:
    """Two levels' tables with the same times and activation bytes."""
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("f", "i", "w", "act_bytes"))
