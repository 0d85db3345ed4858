"""`tune()`: OctoPipe's planner, from costs and a cluster to a checked plan.

1. Baselines: the named schedules (uniform and DP-balanced partitions) through the simulator.
2. Starting points: the ILP's partition + placement (`solvers`) and every feasible baseline.
3. Search: iterated local search on partition, placement and schedule policy, ranked by the
   list-scheduling estimator (`octopipe.tune.search`).
4. Finalists: the best distinct candidates are frozen into tables and fully simulated with
   communication; row moves advance actions into the best table's remaining gaps
   (`octopipe.tune.polish`); the best plan that fits memory and passes the SMT deadlock check
   wins. The starting baselines are finalists too, so the result is never worse than them.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from octopipe.cluster import Cluster
from octopipe.config.convert import convert
from octopipe.config.solver import SolverConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError, OctoPipeError
from octopipe.plan import Plan
from octopipe.tune.attribution import Attribution
from octopipe.tune.baselines import as_candidate, run_baselines
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.evaluate import Evaluated, evaluate, safe
from octopipe.tune.freeze import to_plan
from octopipe.tune.polish import advance_into_bubbles
from octopipe.tune.search import SearchConfig, search
from octopipe.tune.split import LayerSplitter, map_sizes, packed_max


JOINT_ILP_MAX_CELLS = 1024


@dataclass
class TuneResult:
    """What `tune` found: the checked plan, its simulation, and how it compares."""

    plan: Plan
    sim_result: Any                       # octopipe.sim.result.SimResult of `plan`
    evaluated: Evaluated
    history: list[dict]
    baselines: list[Evaluated]
    tuner_seconds: float
    lower_bound_s: float
    tokens_per_iteration: float
    layer_bound_s: float
    search_stats: dict = field(default_factory=dict)
    ilp: dict = field(default_factory=dict)
    costs: CostTable | None = None        # the costs the plan's layers index (split model if split)
    split_counts: dict = field(default_factory=dict)   # original layer -> pieces the search used

    @property
    def makespan_s(self) -> float:
        return float(self.sim_result.makespan)

    @property
    def attribution(self) -> Attribution:
        return self.evaluated.attribution()

    def best_baseline(self, group: str | None = None) -> Evaluated | None:
        ok = [b for b in self.baselines if b.feasible and (group is None or b.group == group)]
        return min(ok, key=lambda b: b.makespan_s) if ok else None

    def speedup_vs(self, ev: Evaluated | None) -> float | None:
        return None if ev is None else ev.makespan_s / self.makespan_s

    def versus_text(self) -> str:
        """'1.12× faster than the best baseline (ZB-H1 balanced)', or why there is no ratio."""
        best = self.best_baseline()
        if best is None:
            return ("no baseline fits in memory (or runs) here, the OctoPipe plan does"
                    if self.baselines else "no baselines were run")
        return f"{self.speedup_vs(best):.2f}× faster than the best baseline ({best.name})"

    def split_text(self) -> str:
        """'head (layer 53) in 2 pieces, ...' for a plan that splits layers, else ''."""
        meta = self.plan.meta
        shards, names = meta.get("shards", {}), meta.get("split_names", {})
        if not shards:
            return ""
        parts = [f"{names.get(k, names.get(str(k), 'layer'))} (layer {k}) in {v}"
                 for k, v in sorted(shards.items(), key=lambda kv: int(kv[0]))]
        total = sum(int(v) for v in shards.values())
        if len(parts) > 4:
            parts = parts[:3] + [f"{len(parts) - 3} more layers"]
        how = ("pieces priced from their shapes" if meta.get("split_costs") == "model"
               else "each piece costed as an even share of its measured layer")
        return f"{', '.join(parts)} ({len(shards)} layers into {total} pieces; {how})"

    def summary(self) -> dict:
        """The summary.json figures (snake_case, units in the names)."""
        s = self.sim_result
        best = self.best_baseline()
        bu, bb = self.best_baseline("uniform"), self.best_baseline("balanced")
        out = {
            "makespan_s": self.makespan_s,
            "throughput_tokens_per_s": self.tokens_per_iteration / self.makespan_s,
            "bubble_ratio": float(s.bubble_ratio),
            "peak_memory_bytes": float(max(s.peak_memory)),
            "device_peak_memory_bytes": [float(x) for x in s.peak_memory],
            "lower_bound_s": self.lower_bound_s,
            "efficiency_vs_lower_bound": self.lower_bound_s / self.makespan_s,
            "layer_bound_s": self.layer_bound_s,
            "efficiency_vs_layer_bound": self.layer_bound_s / self.makespan_s,
            "tuner_seconds": self.tuner_seconds,
            "best_baseline": best.name if best else None,
            "speedup_vs_best_baseline": self.speedup_vs(best),
            "best_uniform_baseline": bu.name if bu else None,
            "speedup_vs_best_uniform": self.speedup_vs(bu),
            "best_balanced_baseline": bb.name if bb else None,
            "speedup_vs_best_balanced": self.speedup_vs(bb),
            "n_stages": len(self.plan.partition),
            "partition_sizes": [hi - lo for lo, hi in self.plan.partition],
            "placement": list(self.plan.placement),
            "plan_origin": self.plan.meta.get("origin", ""),
            "split_layers": {str(k): v for k, v in self.plan.meta.get("shards", {}).items()},
            "bubble_causes_s": self.attribution.totals(),
            "checks": self.evaluated.checks,
            "search": self.search_stats,
        }
        for b in self.baselines:
            label = b.name.split(" (")[0]          # "I-1F1B (v=4)" -> one key for any chunk count
            key = "".join(ch if ch.isalnum() else "_" for ch in label.lower()).strip("_")
            while "__" in key:
                key = key.replace("__", "_")
            out[f"speedup_vs_{key}"] = self.speedup_vs(b) if b.feasible else None
        return out


def _ilp_starts(problem: Problem, solver_cfg: SolverConfig, time_limit: float) -> tuple[list[Candidate], dict]:
    """ILP partitions (solvers) as starting candidates: the joint partition + placement ILP with
    one stage per device (the partition ILP on the loop placement for large instances), and the
    partition ILP on the V placement with two stages per device."""
    from solvers.partition_ilp import solve_partition
    from solvers.placement_ilp import solve_partition_placement
    from octopipe.schedule.table import v_placement
    scfg = replace(solver_cfg, time_limit_s=max(1.0, min(solver_cfg.time_limit_s, time_limit)))
    D, L, M = problem.n_devices, problem.n_layers, problem.n_microbatches
    # the joint ILP with several stages per device takes tens of seconds on this class of
    # machine, more than the whole tuning budget; beyond JOINT_ILP_MAX_CELLS layer-device pairs
    # even one stage per device does (building the model alone overran its limit: 82 layers x 32
    # devices took 29 s), so large instances fix the loop placement and solve the partition ILP
    runs = [("loop", 1, "zbh1", None if L * D <= JOINT_ILP_MAX_CELLS else tuple(range(D))),
            ("V", 2, "zbv", v_placement(D, 2))]
    cands: list[Candidate] = []
    info: dict = {}
    for label, chunks, sched, placement in runs:
        if D * chunks > L:
            continue
        t0 = time.perf_counter()
        try:
            if placement is None:
                res = solve_partition_placement(problem.costs, problem.cluster, D * chunks,
                                                schedule_name=sched, n_microbatches=M,
                                                chunks=chunks, solver_cfg=scfg)
            else:
                res = solve_partition(problem.costs, problem.cluster, D * chunks, placement,
                                      schedule_name=sched, n_microbatches=M, chunks=chunks,
                                      solver_cfg=scfg)
        except OctoPipeError as e:
            run = {"status": "infeasible", "reason": str(e).splitlines()[0], "schedule": sched}
        else:
            run = {"method": res.method, "status": res.status, "objective_s": res.objective,
                   "proven_optimal": res.proven_optimal, "fits_memory": res.fits_memory,
                   "solve_time_s": time.perf_counter() - t0, "stages": len(res.partition),
                   "schedule": sched}
            if res.partition:
                sizes = tuple(hi - lo for lo, hi in res.partition)
                cands += [Candidate(sizes, tuple(res.placement), split, infl, origin=f"ILP {label}")
                          for split in (True, False) for infl in (1.0, 2.0, math.inf)]
        if label == "loop":
            info = run
        else:
            info["v"] = run
    return cands, info


def tune(costs: CostTable, cluster: Cluster, n_devices: int, n_microbatches: int, *,
         tuner_cfg: TunerConfig | Mapping[str, Any] | None = None,
         solver_cfg: SolverConfig | Mapping[str, Any] | None = None, semantics: str = "eager", seed: int = 0,
         model: str = "", baselines: bool = True, starts: Sequence[Candidate] = (),
         progress: bool = False, splitter: LayerSplitter | None = None) -> TuneResult:
    """Plan `costs` on the first `n_devices` of `cluster` for `n_microbatches` per iteration.

    tuner_cfg: the typed `tuner` section (None: its defaults; a mapping of overrides goes through
    the schema); solver_cfg: the `solver` section for the ILP start (likewise);
    semantics: the runtime's communication semantics (eager, rendezvous, batched) used by the
    simulator and the SMT check. splitter: how heavy layers may split (`octopipe.tune.split`);
    the search then runs on the split model, the baselines on the model as given, and a split
    plan records its pieces in `plan.meta["shards"]` (original layer index -> pieces).
    Raises InfeasibleError when no plan fits memory.
    """
    t0 = time.perf_counter()
    cfg = tuner_cfg if isinstance(tuner_cfg, TunerConfig) else convert(TunerConfig, tuner_cfg, "tuner.")
    solver_cfg = (solver_cfg if isinstance(solver_cfg, SolverConfig)
                  else convert(SolverConfig, solver_cfg, "solver."))
    search_cfg = SearchConfig.of(cfg)
    whole = Problem.build(costs, cluster, n_devices, n_microbatches, semantics)
    base = run_baselines(whole, model) if baselines else []
    problem, counts = whole, {}
    if splitter is not None and cfg.split_layers == "auto":
        problem, counts = _choose_split(whole, splitter, cfg.split_share)
    elif splitter is not None and cfg.split_layers == "force":
        counts = splitter.counts(whole.layer_work().min(axis=1), n_devices, cfg.split_share)
        problem = _split_problem(whole, splitter, counts)
    start_cands = [_on_split(as_candidate(b), counts) for b in base if b.feasible]
    start_cands += [_on_split(c, counts) for c in starts]
    def problem_of(plan: Plan) -> Problem:        # split plans index the split model's layers
        return problem if "shards" in plan.meta else whole

    shard_meta = {"shards": {int(k): int(v) for k, v in counts.items()},
                  "split_names": {int(k): costs.layer_names[k] for k in counts},
                  "split_costs": splitter.source} if counts else {}
    ilp_info: dict = {}
    if cfg.ilp:
        try:
            ilp_cands, ilp_info = _ilp_starts(problem, solver_cfg, 0.1 * search_cfg.time_budget_s)
            start_cands = ilp_cands + start_cands
        except (OctoPipeError, ImportError) as e:
            ilp_info = {"status": "unavailable", "reason": str(e).splitlines()[0]}
    spent = time.perf_counter() - t0
    # the rest of the budget: search, then finalists, row moves and checks (kept in the budget)
    budget = max(0.5, 0.85 * (search_cfg.time_budget_s - spent) - cfg.polish_s)
    scfg = replace(search_cfg, time_budget_s=budget)
    with _progress(progress, budget) as update:
        outcome = search(problem, start_cands, scfg, seed, on_progress=update,
                         pool_size=max(cfg.finalists * 3, 8))
    finals: list[Evaluated] = []
    seen_tables = set()
    for est, cand in outcome.pool:
        if len(finals) >= cfg.finalists or (finals and time.perf_counter() - t0 > search_cfg.time_budget_s):
            break
        plan = to_plan(problem, cand, model=model,
                       meta={"origin": f"tuned from {cand.origin or 'seed'}", "estimate_s": est,
                             "candidate": cand.describe(), **shard_meta})
        key = (plan.partition, plan.table.rows)
        if key in seen_tables:
            continue
        seen_tables.add(key)
        finals.append(evaluate(problem, "OctoPipe", "octopipe", plan))
    for b in base:      # never worse than a starting point: baselines compete as plans too
        if b.feasible:
            plan = replace(b.plan, meta={**b.plan.meta, "origin": f"baseline {b.name} (not improved)"})
            finals.append(Evaluated("OctoPipe", "octopipe", plan, b.sim, True))
    finals.sort(key=lambda e: (not e.feasible, e.makespan_s))
    history = list(outcome.history)
    if finals and finals[0].feasible and cfg.polish_s > 0 and not finals[0].plan.table.is_lowered:
        top = finals[0]
        left = search_cfg.time_budget_s - (time.perf_counter() - t0)
        plan, sim, moves = advance_into_bubbles(problem_of(top.plan), top.plan, top.sim,
                                                min(cfg.polish_s, max(0.0, left)))
        if moves:
            plan = replace(plan, meta={**plan.meta, "row_moves": moves})
            finals.insert(0, Evaluated("OctoPipe", "octopipe", plan, sim, True))
            history.append({"t_s": time.perf_counter() - t0, "iteration": outcome.iterations,
                            "makespan_s": float(sim.makespan), "move": f"row reorder x{len(moves)}",
                            "candidate": moves[-1]})
    chosen = None
    for ev in finals:
        if not ev.feasible:
            break
        ev = safe(problem, ev, cfg.smt_max_actions)
        if ev.feasible:
            chosen = ev
            break
    if chosen is None:
        notes = "; ".join(sorted({e.note for e in finals if e.note})) or "no candidate completed"
        raise InfeasibleError(f"no plan for {n_devices} devices × {n_microbatches} micro-batches "
                              f"passes the checks ({notes}); try more devices or fewer micro-batches")
    tokens = problem.n_microbatches * float(costs.tokens_per_microbatch)
    stats = {"evaluations": outcome.evaluations, "iterations": outcome.iterations,
             "stop_reason": outcome.stop_reason, "estimate_s": outcome.best_makespan,
             "search_budget_s": budget}
    on = problem_of(chosen.plan)
    return TuneResult(chosen.plan, chosen.sim, chosen, history, base,
                      time.perf_counter() - t0, whole.lower_bound(), tokens,
                      on.layer_bound(), stats, ilp_info, on.costs, dict(counts))


def _split_problem(whole: Problem, splitter: LayerSplitter, counts: dict) -> Problem:
    """`whole` with its layers split by `counts` (itself when nothing splits)."""
    if not counts:
        return whole
    return Problem.build(splitter.costs_for(counts), whole.cluster, whole.n_devices,
                         whole.n_microbatches, whole.semantics)


def _choose_split(whole: Problem, splitter: LayerSplitter, max_share: float,
                  gain: float = 0.01) -> tuple[Problem, dict]:
    """The split worth searching: of `splitter.options`, the fewest pieces whose bound is within
    `gain` of the lowest. A split's bound is the larger of its layer bound (the heaviest piece
    with the fill before it and the drain after it) and its pieces packed onto the devices (LPT),
    so both kinds of gap count: an LM head heavier than a device's share, and 26 equal MoE
    layers on 8 devices, where one device must take 4 (23% over the share; thirds: 2.6%)."""
    D, M = whole.n_devices, whole.n_microbatches
    work = whole.layer_work().min(axis=1)
    scored = []
    for counts in splitter.options(work, D, max_share):
        pb = _split_problem(whole, splitter, counts)
        bound = max(pb.layer_bound(), M * packed_max(pb.layer_work().min(axis=1), D))
        scored.append((bound, sum(counts.values()), pb, counts))
    best = min(b for b, _, _, _ in scored)
    _, _, pb, counts = min((s for s in scored if s[0] <= best * (1 + gain)), key=lambda s: s[1])
    return pb, counts


def _on_split(cand: Candidate, counts: dict) -> Candidate:
    """A candidate over the original layers as the same stages over the split model."""
    return replace(cand, sizes=map_sizes(cand.sizes, counts)) if counts else cand


def _progress(show: bool, budget: float):
    if not show:
        return nullcontext(None)
    from contextlib import contextmanager

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("[bold]tuning[/]"), BarColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), transient=True) as prog:
            task = prog.add_task("", total=budget)

            def update(elapsed: float, best: float, it: int) -> None:
                prog.update(task, completed=min(elapsed, budget),
                            description=f"best {best * 1e3:.1f} ms · iter {it}")
            yield update
    return bar()
