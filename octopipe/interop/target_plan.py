"""The planner held to one stack's rules (`target=`): the fastest plan that stack can run.

Per layout the target allows (placement style × stages per rank) the tuner searches with the levers
that stay free: the partition always; the table when the target takes any F/I/W/B table; the
placement only where any stage → rank map runs. Granularity is kept by searching over the
stack's modules (`Units.merge`: a decoder layer is one row, so no stage bound can fall inside
it). The target's own named schedules, on uniform and balanced partitions, compete too, so the
target's plan is never slower than the best schedule the stack ships with. Every plan is checked
against the rules (`violations`) on the model's layers before it is returned.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from octopipe.cluster import Cluster
from octopipe.config.tuner import LEVERS
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, InfeasibleError, OctoPipeError
from octopipe.interop.targets import Target, layout_of, placement_of, unsupported, violations
from octopipe.interop.units import Units
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.tune import TuneOptions, tune
from octopipe.tune.baselines import dp_balanced
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.evaluate import Evaluated, evaluate, safe


@dataclass(frozen=True)
class TargetCase:
    """One planning case: the costs per layer, the stack's modules over them (None: the model
    has no module names, so only `pieces`/`layers` targets apply), the ranks and micro-batches,
    and the run's tuner options (tuner, solver, semantics, seed, model, splitter)."""

    costs: CostTable
    units: Units | None
    cluster: Cluster
    n_devices: int
    n_microbatches: int
    options: TuneOptions
    chunks: int | None = None           # stages per rank the user asked for (None: any)


@dataclass(frozen=True)
class TargetPlan:
    """The target's best plan on the model's layers, the target's own schedules beside it, and
    what each layout's search gave (`tried`: placement, chunks, makespan or why not)."""

    target: Target
    best: Evaluated
    baselines: tuple[Evaluated, ...]
    tried: tuple[dict, ...]

    @property
    def makespan_s(self) -> float:
        return self.best.makespan_s

    def best_baseline(self) -> Evaluated | None:
        ok = [b for b in self.baselines if b.feasible]
        return min(ok, key=lambda b: b.makespan_s) if ok else None

    @property
    def layout(self) -> tuple[str, int]:
        t = self.best.plan.table
        return layout_of(tuple(t.placement), t.n_devices) or ("any", 0)


def _searched(target: Target, case: TargetCase) -> tuple[CostTable, Units | None]:
    """The rows the search moves stage bounds between: the stack's modules, or the layers."""
    why = unsupported(target, case.units)
    if why:
        raise ConfigError(why)
    if target.granularity != "units":
        return case.costs, None
    return case.units.merge(case.costs), case.units


def _on_layers(plan: Plan, units: Units | None) -> Plan:
    return plan if units is None else replace(plan, partition=units.to_layers(plan.partition))


def _problem(costs: CostTable, case: TargetCase) -> Problem:
    o = case.options
    return Problem.build(costs, case.cluster, case.n_devices, case.n_microbatches, o.semantics, None,
                         o.tuner.link_contention)


def _layout_options(target: Target, style: str, v: int, n_rows: int, n_devices: int) -> dict:
    """The tuner's options that hold the search to one layout of the target."""
    if style == "any":
        levers = tuple(x for x in LEVERS if (x != "split_layers" or target.granularity == "pieces")
                       and (x != "schedule" or not target.fixed))
        return {"levers": levers, "reference": None, "fixed_schedule": "1f1b"}
    placement = placement_of(style, n_devices, v)
    fixed = target.schedule_for(v)
    ref = Candidate(Partition.uniform(n_rows, len(placement)), placement, False, 1.0,
                    origin=f"{style} placement, {v} stage(s) per rank")
    return {"levers": ("partition",) if fixed else ("partition", "schedule"), "reference": ref,
            "fixed_schedule": fixed or "1f1b"}


def _search_layout(target: Target, case: TargetCase, style: str, v: int) -> Plan:
    """The tuner's plan for one layout, over the searched rows (modules or layers)."""
    costs, _ = _searched(target, case)
    lo = _layout_options(target, style, v, costs.n_layers, case.n_devices)
    o = case.options
    tuner = replace(o.tuner, levers=lo["levers"], ilp=o.tuner.ilp and style in ("any", "one"))
    opts = replace(o, tuner=tuner, reference=lo["reference"], fixed_schedule=lo["fixed_schedule"],
                   splitter=o.splitter if target.granularity == "pieces" else None,
                   starts=(), plans=(), progress=False)
    res = tune(costs, case.cluster, case.n_devices, case.n_microbatches, opts)
    return res.plan


def refine_bounds(problem: Problem, start: Evaluated, sims: int) -> Evaluated:
    """First-improvement descent on the stage bounds of a plan whose table stays fixed (a stack's
    own schedule): move one bound by one row at a time, keep a move that is feasible and faster,
    stop after `sims` simulations or when no move helps. The list scheduler cannot rank these
    partitions, since the table is not its order; the simulator does."""
    best, used, improved = start, 0, True
    while improved and used < sims:
        improved = False
        sizes = list(best.plan.partition.sizes)
        for k in range(len(sizes) - 1):
            for step in (1, -1):
                a, b = sizes[k] - step, sizes[k + 1] + step
                if a < 1 or b < 1 or used >= sims:
                    continue
                trial = sizes[:k] + [a, b] + sizes[k + 2:]
                used += 1
                ev = evaluate(problem, best.name, best.group, replace(best.plan, partition=Partition(tuple(trial))))
                if ev.feasible and ev.makespan_s < best.makespan_s * (1 - 1e-9):
                    best, sizes, improved = ev, trial, True
    return best


def target_baselines(target: Target, case: TargetCase, problem: Problem) -> list[Evaluated]:
    """The target's named schedules on uniform and balanced partitions of the searched rows,
    evaluated on them (`problem`)."""
    D, M, n = case.n_devices, case.n_microbatches, problem.n_layers
    out = []
    for name, v in target.baselines:
        if D * v > n:
            continue
        try:
            table = build_schedule(name, D, M, v)
        except OctoPipeError:
            continue
        label = (SCHEDULES[name].torch_class or name) if target.name in ("torch", "torchtitan") else name
        for group in ("uniform", "balanced"):
            part = (Partition.uniform(n, table.n_stages) if group == "uniform"
                    else dp_balanced(problem, name, tuple(table.placement)))
            plan = Plan(part, table, model=case.options.model, cluster=case.cluster.name,
                        meta={"baseline": label, "schedule": name, "chunks": v, "target": target.name})
            if "any" not in target.placements and layout_of(tuple(table.placement), D) is None:
                continue
            out.append(evaluate(problem, f"{label} v={v} ({group})", group, plan))
    return out


def _fixed_best(target: Target, case: TargetCase, problem: Problem, starts: list[Evaluated]) -> Evaluated | None:
    """For a target that runs only its own schedules: the best start with its bounds refined."""
    ok = [e for e in starts if e.feasible]
    if not ok:
        return None
    return refine_bounds(problem, min(ok, key=lambda e: e.makespan_s), 4 * case.options.tuner.polish_sims)


def _no_layout(target: Target, case: TargetCase, n_rows: int) -> str:
    """Why the target has no layout for these ranks, stages per rank and modules."""
    D, v = case.n_devices, case.chunks
    if v is not None and not target.chunk_options(D, 10 ** 9, v):
        allowed = sorted({c for _, c in target.chunk_options(D, 10 ** 9) if c})
        return (f"chunks={v}: {target.stack} runs {' or '.join(map(str, allowed))} stage(s) per rank; "
                f"set chunks to one of them or drop it")
    unit = "decoder layers with the embedding and head" if target.granularity == "units" else "layers"
    return (f"pp={D}" + (f" x chunks={v}" if v else "") + f": {target.stack} needs at least one of the model's "
            f"{n_rows} {unit} per stage; lower pp or chunks")


def check_target(target: Target, case: TargetCase) -> list[tuple[str, int]]:
    """The layouts the target may use for this case; ConfigError (one line) when it cannot run the
    model or has no layout for its ranks and stages per rank. Cheap: run it before any search."""
    costs, _ = _searched(target, case)
    options = target.chunk_options(case.n_devices, costs.n_layers, case.chunks)
    if not options:
        raise ConfigError(_no_layout(target, case, costs.n_layers))
    return options


def plan_target(target: Target, case: TargetCase,
                progress: Callable[[str], None] = lambda _: None) -> TargetPlan:
    """The fastest plan `target` runs (InfeasibleError when none fits memory)."""
    costs, units = _searched(target, case)
    problem, layers = _problem(costs, case), _problem(case.costs, case)
    D = case.n_devices
    named = [b for b in target_baselines(target, case, problem)
             if case.chunks is None or b.plan.table.n_stages == case.chunks * D]
    tried: list[dict] = []
    found: list[Evaluated] = []
    for style, v in check_target(target, case):
        progress(f"planning for {target.name}: {style} placement" + (f", {v} stage(s) per rank" if v else ""))
        entry = {"placement": style, "chunks": v}
        starts = [b for b in named if style == "any" or tuple(b.plan.table.placement) == placement_of(style, D, v)]
        try:
            starts.insert(0, evaluate(problem, f"OctoPipe for {target.name}", "target",
                                      _search_layout(target, case, style, v)))
        except (InfeasibleError, ConfigError) as e:
            entry["search"] = str(e).splitlines()[0]
        if target.fixed:
            starts = [e for e in (_fixed_best(target, case, problem, starts),) if e is not None]
        ok = [e for e in starts if e.feasible and not violations(_on_layers(e.plan, units), target, units)]
        if ok:
            found.append(min(ok, key=lambda e: e.makespan_s))
        tried.append({**entry, "makespan_s": found[-1].makespan_s if ok else None})
    if not found:
        why = "; ".join(f"{t['placement']} x{t['chunks']}: {t.get('search', 'nothing fits')}" for t in tried)
        raise InfeasibleError(f"target={target.name}: no plan {target.stack} can run fits memory at "
                              f"pp={D}, microbatches={case.n_microbatches} "
                              f"({why or 'no layout fits these ranks and modules'}); "
                              "try more devices, fewer micro-batches or another target")
    best = None
    for top in sorted(found, key=lambda e: e.makespan_s):
        plan = _on_layers(top.plan, units)
        bad = violations(plan, target, units)
        if bad:
            raise OctoPipeError(f"internal: the {target.name} plan breaks its rules: {bad[0]}")
        best = safe(layers, evaluate(layers, f"OctoPipe for {target.name}", "target", plan),
                    case.options.tuner.smt_max_actions)
        if best.feasible:
            break
    if not best.feasible:
        raise InfeasibleError(f"target={target.name}: no plan passes the deadlock check ({best.note})")
    baselines = tuple(evaluate(layers, b.name, b.group, _on_layers(b.plan, units)) for b in named
                      if not violations(_on_layers(b.plan, units), target, units))
    return TargetPlan(target, best, baselines, tuple(tried))
