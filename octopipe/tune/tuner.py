"""`tune()`: OctoPipe's planner, from costs and a cluster to a checked plan, in five stages
over one `TuneState`, each with its own budget (`Budgets`), counted in work (evaluations, nodes,
simulations) so that the same inputs and seed give the same plan at any machine load:

1. baselines: the named schedules (uniform and DP-balanced partitions) through the simulator
   (a fixed list);
2. starting points: the layers the search runs on (heavy layers split, `octopipe.tune.splitting`),
   the feasible baselines and the caller's starts; the ILPs' partitions + placements (`solvers`,
   `ilp_max_nodes` branch-and-bound nodes each) are solved meanwhile, in CBC's own process;
3. search: iterated local search on partition, placement and schedule policy, ranked by the
   list-scheduling estimator (`octopipe.tune.search`; `max_evaluations`, `max_iters`, `patience`);
   the ILPs' candidates join its pool when it ends (so the ILP's seconds overlap the search's);
4. finalists: the best distinct candidates frozen into tables and fully simulated with
   communication, the baselines beside them, and row moves that advance actions into the best
   table's remaining gaps (`octopipe.tune.polish`; `polish_sims` simulations);
5. checks: the best plan that fits memory and passes the SMT deadlock check wins (tables up to
   `smt_max_actions`); since the baselines are finalists, it is never worse than them.

`tuner.time_budget_s` is only a safety cap on the wall clock: a stage it stops is listed in the
result's `stopped_by` (`time_cap`), since that plan depends on the machine's speed and load.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from octopipe.cluster import Cluster
from octopipe.config.convert import convert
from octopipe.config.solver import SolverConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError, OctoPipeError
from octopipe.plan import Plan
from octopipe.sim.stage_span import stage_spans
from octopipe.sim.variability import Variability
from octopipe.tune.baselines import as_candidate, run_baselines
from octopipe.tune.bounds import layer_bound, lower_bound, memory_bound
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.evaluate import Evaluated, evaluate, safe
from octopipe.tune.fill_drain import FillDrain, contiguous_bound, fill_drain
from octopipe.tune.freeze import to_plan
from octopipe.tune.ilp_starts import (
    partition_starts,
)
from octopipe.tune.layout_bound import plan_layout_bound
from octopipe.tune.levers import Levers, reference
from octopipe.tune.memory_budget import (
    activation_budget,
    budget_plans,
)
from octopipe.tune.polish import advance_into_bubbles, place_ws_exactly
from octopipe.tune.robust import Robust, robust_rank
from octopipe.tune.search import (
    SearchConfig,
    SearchOutcome,
    search,
)
from octopipe.tune.split_choice import (
    choose_split,
    on_split_layers,
    split_problem,
)
from octopipe.tune.splitting import LayerSplitter
from octopipe.tune.tune_result import TuneResult
from octopipe.tune.whole_layers import WholeLayersBeside


@dataclass(frozen=True)
class Budgets:
    """What each stage may spend, from the tuner config: work counts, and the wall-clock cap."""

    cap_s: float            # safety cap of the whole run (tuner.time_budget_s)
    evaluations: int        # list-scheduler estimates of the search
    ilp_nodes: int          # branch-and-bound nodes of each ILP start
    polish_sims: int        # simulations of row moves on the best finalist
    finalists: int          # distinct candidates fully simulated
    smt_max_actions: int    # larger tables rely on the simulator's deadlock detection

    @classmethod
    def of(cls, cfg: TunerConfig) -> Budgets:
        return cls(cfg.time_budget_s, cfg.max_evaluations, cfg.ilp_max_nodes, cfg.polish_sims,
                   cfg.finalists, cfg.smt_max_actions)

    @property
    def pool_size(self) -> int:
        """Distinct candidates the search keeps for the finalists (three per finalist, 8 at least)."""
        return max(self.finalists * 3, 8)

    def left_s(self, elapsed_s: float) -> float:
        """What the safety cap leaves."""
        return max(0.0, self.cap_s - elapsed_s)


@dataclass
class TuneState:
    """What the stages share: the inputs, then what each stage adds, in stage order."""

    cfg: TunerConfig
    budgets: Budgets
    whole: Problem                     # the model as given (the baselines run on it)
    model: str
    t0: float                          # when `tune` started: every budget counts from it
    baselines: list[Evaluated] = field(default_factory=list)
    problem: Problem | None = None     # the model the search runs on (`whole`, or layers split)
    counts: dict[int, int] = field(default_factory=dict)   # original layer -> pieces in `problem`
    pieces_meta: dict = field(default_factory=dict)          # provenance of the split, for plans
    levers: Levers | None = None       # what the search may change (tuner.levers)
    starts: list[Candidate] = field(default_factory=list)
    ilp: dict = field(default_factory=dict)
    outcome: SearchOutcome | None = None
    capped: list[str] = field(default_factory=list)         # stages the safety cap stopped
    polish_stop: str = ""
    finals: list[Evaluated] = field(default_factory=list)  # ranked, best first
    history: list[dict] = field(default_factory=list)
    chosen: Evaluated | None = None
    robust: dict = field(default_factory=dict)              # objective=mean|quantile: the scoring

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def problem_of(self, plan: Plan) -> Problem:
        """The problem a plan's layers index: split plans the split model's."""
        return self.problem if plan.pieces else self.whole


@dataclass(frozen=True)
class TuneOptions:
    """How one `tune` call runs, besides its instance (costs, cluster, devices, micro-batches).

    tuner: conf/tuner (`TunerConfig`, or a mapping of its fields); solver: conf/solver for the
    ILP start (`SolverConfig`, or a mapping); semantics: the runtime's communication semantics
    (eager, rendezvous, batched) used by the simulator and the SMT check; seed: the search's
    random choices; model: the name plans carry; baselines: run the named schedules (and let
    them compete as plans); starts: the caller's own starting candidates; progress: show a
    terminal bar while searching; splitter: how heavy layers may split (`octopipe.tune.splitting`);
    plans: the caller's own plans, simulated and ranked with the finalists (over the model as
    given, or its split when they split layers), so the result is never worse than any of them;
    reference: the candidate whose partition, placement and policy the levers left out keep
    (None: S-1F1B); fixed_schedule: the named schedule whose table a plan takes when the schedule
    is no lever (a stack that runs only its own schedules); variability: the variability model
    bound to a plan's stages, for tuner.objective=mean|quantile (None: no variability).
    """

    tuner: TunerConfig | Mapping[str, Any] | None = None
    solver: SolverConfig | Mapping[str, Any] | None = None
    semantics: str = "eager"
    seed: int = 0
    model: str = ""
    baselines: bool = True
    starts: Sequence[Candidate] = ()
    progress: bool = False
    splitter: LayerSplitter | None = None
    plans: Sequence[Plan] = ()
    reference: Candidate | None = None
    fixed_schedule: str = "1f1b"
    variability: Callable[[Plan], Variability] | None = None

    def __post_init__(self) -> None:
        """Mappings (and None) become the typed configs; a bad value raises ConfigError."""
        if not isinstance(self.tuner, TunerConfig):
            object.__setattr__(self, "tuner", convert(TunerConfig, self.tuner, "tuner."))
        if not isinstance(self.solver, SolverConfig):
            object.__setattr__(self, "solver", convert(SolverConfig, self.solver, "solver."))
        object.__setattr__(self, "starts", tuple(self.starts))
        object.__setattr__(self, "plans", tuple(self.plans))


def tune(costs: CostTable, cluster: Cluster, n_devices: int, n_microbatches: int,
         options: TuneOptions = TuneOptions()) -> TuneResult:
    """Plan `costs` on the first `n_devices` of `cluster` for `n_microbatches` per iteration.

    With `options.splitter`, the search runs on the split model, the baselines on the model as
    given, and a split plan records its pieces in `plan.pieces` (original layer index -> pieces).
    Raises InfeasibleError when no plan fits memory.
    """
    t0 = time.perf_counter()
    o = options
    links = o.tuner.link_contention
    whole = Problem.build(costs, cluster, n_devices, n_microbatches, o.semantics, None, links)
    if o.tuner.memory_budget is not None:
        whole = Problem.build(costs, cluster, n_devices, n_microbatches, o.semantics,
                              activation_budget(whole, o.tuner.memory_budget), links)
    st = TuneState(o.tuner, Budgets.of(o.tuner), whole, o.model, t0)
    st.baselines = run_baselines(whole, o.model) if o.baselines else []  # 1. baselines: a fixed list
    st.problem, st.counts, st.pieces_meta = layers_to_search(  # 2. starting points:
        st, o.splitter if "split_layers" in o.tuner.levers else None)
    ref = o.reference if o.reference is not None else reference(whole.n_layers, whole.n_devices)
    st.levers = Levers.of(o.tuner.levers, on_split_layers(ref, st.counts), o.fixed_schedule)
    st.starts = starting_points(st, o.starts)
    with WholeLayersBeside((whole, st.baselines, st.cfg, o.seed, st.budgets.left_s(st.elapsed()), o.model)
                           if st.counts else None) as beside:  # with pieces, a whole-layer search beside
        ilp = in_background(ilp_starts, st, o.solver) if st.cfg.ilp else None  # ILPs: ilp_max_nodes
        st.outcome = search_or_ilp(st, ilp, o.seed, o.progress)    # 3. search: max_evaluations
        join_ilp(st, ilp)                                      #    the ILPs' candidates join its pool
        seeds = [*(budget_plans(whole, o.model) if whole.act_budget is not None else []), *beside.plans()]
    st.finals, st.history = finalists(st, [*o.plans, *seeds])  # 4. finalists, polish_sims
    w_ilp(st, o.solver)                                    #    the W-placement ILP on small tables
    if st.cfg.objective != "nominal":                      #    robust: Monte Carlo scores, tuner.samples
        robust = Robust(st.cfg.objective, st.cfg.quantile, st.cfg.samples, st.cfg.dispatch,
                        o.variability or (lambda plan: Variability()), o.seed, o.semantics)
        st.finals, st.robust = robust_rank(st.finals, st.problem_of, robust, st.cfg.finalists)
    st.chosen = checks(st)                                 # 5. checks: SMT up to smt_max_actions
    return result(st)


# ---------------------------------------------------------------------------------------------
# The stages, in the order `tune` runs them


def layers_to_search(st: TuneState, splitter: LayerSplitter | None
                     ) -> tuple[Problem, dict[int, int], dict]:
    """Starting points (1/2): the model the search runs on, its pieces (original layer ->
    pieces) and their provenance for the plans' meta."""
    cfg, whole = st.cfg, st.whole
    problem, counts = whole, {}
    choice: list[dict] = []
    if splitter is not None and cfg.split_layers == "auto":
        problem, counts, choice = choose_split(whole, splitter, cfg.split_share, cfg.max_chunks)
    elif splitter is not None and cfg.split_layers == "force":
        counts = splitter.counts(whole.layer_work().min(axis=1), whole.n_devices, cfg.split_share)
        problem = split_problem(whole, splitter, counts)
    meta = {"piece_names": {int(k): whole.costs.layer_names[k] for k in counts},
            "piece_costs": splitter.source} if counts else {}
    if len(choice) > 1:
        meta["piece_choice"] = choice
    return problem, {int(k): int(v) for k, v in counts.items()}, meta


def starting_points(st: TuneState, starts: Sequence[Candidate]) -> list[Candidate]:
    """Starting points (2/2): the feasible baselines and the caller's starts, over the layers
    the search runs on (the ILPs' join the search's pool: `join_ilp`)."""
    cands = [on_split_layers(as_candidate(b), st.counts) for b in st.baselines if b.feasible]
    cands += [on_split_layers(c, st.counts) for c in starts]
    # every search, whatever its levers, also starts from S-1F1B (on the searched layers): a
    # subset's search starts there, so the full search must too, or it could refuse (or miss)
    # what the subset finds from it
    cands.append(st.levers.ref)
    return cands


def in_background(fn: Callable[..., Any], *args: Any) -> Future:
    """`fn(*args)` on a daemon thread (an interrupted run does not wait for it to end)."""
    fut: Future = Future()

    def work() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:
            fut.set_exception(e)
    threading.Thread(target=work, daemon=True, name="octopipe-ilp").start()
    return fut


def ilp_starts(st: TuneState, solver_cfg: SolverConfig) -> tuple[list[Candidate], dict]:
    """The ILPs' candidates (`Budgets.ilp_nodes` nodes each) and their record for the summary.
    Runs beside the search: it reads only `st`'s inputs, which the search does not change."""
    try:
        # the node limit ends the solve; the time limit is only the tuner's safety cap, so
        # that a loaded machine does not stop CBC at another incumbent
        scfg = replace(solver_cfg, max_nodes=st.budgets.ilp_nodes,
                       time_limit_s=max(1.0, st.budgets.left_s(st.elapsed())))
        return partition_starts(st.problem, scfg)
    except (OctoPipeError, ImportError) as e:
        return [], {"status": "unavailable", "reason": str(e).splitlines()[0]}


def search_or_ilp(st: TuneState, ilp: Future[tuple[list[Candidate], dict]] | None, seed: int,
                  progress: bool) -> SearchOutcome:
    """Search from the starting points; when none of them fits (InfeasibleError), search again
    from the ILPs' candidates first, whose partitions respect each device's memory."""
    try:
        return run_search(st, seed, progress)
    except InfeasibleError:
        cands = ilp.result()[0] if ilp is not None else []
        if not cands:
            raise
    st.starts = cands + st.starts
    return run_search(st, seed, progress)


def join_ilp(st: TuneState, ilp: Future[tuple[list[Candidate], dict]] | None) -> None:
    """Search (end): wait for the ILPs and rank their candidates (projected on the levers) into
    the search's pool, so that a finalist is never worse than an ILP start's estimate. The
    wait is for work of a fixed size (node limits), so the pool is the same at any load."""
    if ilp is None:
        return
    cands, st.ilp = ilp.result()
    if st.ilp.get("time_capped") or st.ilp.get("v", {}).get("time_capped"):
        st.capped.append("ilp")
    out, size = st.outcome, st.budgets.pool_size
    pool, seen = list(out.pool), {c for _, c in out.pool}
    for c in cands:
        c = st.levers.project(c)
        if c is None or c in seen:
            continue
        seen.add(c)
        v = st.problem.estimate_makespan(c)
        if math.isfinite(v):
            pool.append((v, c))
    pool.sort(key=lambda t: t[0])          # stable: the search's own entries first on a tie
    out.pool = pool[:size]
    if out.pool and out.pool[0][0] < out.best_makespan * (1 - 1e-9):
        out.best_makespan, out.best = out.pool[0]


def run_search(st: TuneState, seed: int, progress: bool) -> SearchOutcome:
    """Search: iterated local search from the starting points within `Budgets.evaluations`
    (and what the safety cap leaves)."""
    scfg = replace(SearchConfig.of(st.cfg), time_budget_s=st.budgets.left_s(st.elapsed()))
    with _progress(progress, st.budgets.evaluations) as update:
        out = search(st.problem, st.starts, scfg, seed, on_progress=update,
                     pool_size=st.budgets.pool_size, levers=st.levers)
    if out.stop_reason == "time_cap":
        st.capped.append("search")
    return out


def finalists(st: TuneState, plans: Sequence[Plan] = ()) -> tuple[list[Evaluated], list[dict]]:
    """Finalists: the search pool's best distinct tables (up to `Budgets.finalists`), the
    baselines that keep the levers that are off, and the caller's `plans`, ranked; then row moves
    on the best one (`Budgets.polish_sims`, when the schedule is a lever). Returns them ranked
    and the search history."""
    b, problem = st.budgets, st.problem
    finals: list[Evaluated] = []
    seen_tables = set()
    for est, cand in st.outcome.pool:
        if len(finals) >= b.finalists:
            break
        if finals and st.elapsed() > b.cap_s:
            st.capped.append("finalists")
            break
        plan = st.levers.frozen_table(to_plan(problem, cand, model=st.model, pieces=st.counts,
                                              meta={"origin": f"tuned from {cand.origin or 'seed'}",
                                                    "estimate_s": est, "candidate": cand.describe(),
                                                    **st.pieces_meta}))
        key = (plan.partition, plan.table.rows)
        if key in seen_tables:
            continue
        seen_tables.add(key)
        finals.append(evaluate(problem, "OctoPipe", "octopipe", plan))
    for base in st.baselines:      # never worse than a starting point: baselines compete as plans too
        if base.feasible and st.levers.conforms(as_candidate(base)):
            plan = replace(base.plan, meta={**base.plan.meta, "origin": f"baseline {base.name} (not improved)"})
            finals.append(Evaluated("OctoPipe", "octopipe", plan, base.sim, True))
    for k, plan in enumerate(plans):
        if plan.pieces and {int(a): int(n) for a, n in plan.pieces.items()} != st.counts:
            continue               # pieces this run does not price: it cannot rank the plan
        plan = replace(plan, meta={**plan.meta, "origin": plan.meta.get("origin", f"caller's plan {k}")})
        finals.append(evaluate(st.problem_of(plan), "OctoPipe", "octopipe", plan))
    finals.sort(key=lambda e: _rank(e, problem.act_budget is not None))
    history = list(st.outcome.history)
    if (finals and finals[0].feasible and b.polish_sims > 0 and st.levers.has("schedule")
            and not finals[0].plan.table.is_lowered):
        top = finals[0]
        n_actions = sum(1 for _ in top.plan.table)
        sims = min(b.polish_sims, max(1, st.cfg.polish_work // max(1, n_actions)))
        plan, sim, moves, st.polish_stop = advance_into_bubbles(
            st.problem_of(top.plan), top.plan, top.sim, sims, b.left_s(st.elapsed()))
        if st.polish_stop == "time_cap":
            st.capped.append("polish")
        if moves:
            plan = replace(plan, meta={**plan.meta, "row_moves": moves})
            finals.insert(0, Evaluated("OctoPipe", "octopipe", plan, sim, True))
            history.append({"t_s": st.elapsed(), "iteration": st.outcome.iterations,
                            "makespan_s": float(sim.makespan), "move": f"row reorder x{len(moves)}",
                            "candidate": moves[-1]})
    return finals, history


def _rank(ev: Evaluated, budgeted: bool) -> tuple:
    """Finalists' order: feasible first, then makespan; under a memory budget, equal makespans
    (to 1e-12 s) rank by the longest stage span (zero-bubble's cost, `sim.stage_span`)."""
    if not budgeted or ev.sim is None:
        return (not ev.feasible, ev.makespan_s)
    return (not ev.feasible, round(ev.makespan_s, 12), float(stage_spans(ev.sim).max()))


def w_ilp(st: TuneState, solver_cfg: SolverConfig) -> None:
    """Finalists (polish): the W-placement ILP on the best table when it splits backward and has
    at most `tuner.w_ilp_max_actions` actions (`Budgets.ilp_nodes` nodes, within the cap)."""
    if not st.finals or not st.finals[0].feasible or not st.levers.has("schedule"):
        return
    top = st.finals[0]
    n = sum(1 for _ in top.plan.table)
    if n > st.cfg.w_ilp_max_actions or not top.plan.table.splits_backward:
        return
    scfg = replace(solver_cfg, max_nodes=st.budgets.ilp_nodes,
                   time_limit_s=max(1.0, st.budgets.left_s(st.elapsed())))
    plan, sim, what = place_ws_exactly(st.problem_of(top.plan), top.plan, top.sim, scfg)
    st.ilp["w_placement"] = what
    if what == "time_cap":
        st.capped.append("w_placement")
    if plan is not top.plan:
        plan = replace(plan, meta={**plan.meta, "w_placement": what})
        st.finals.insert(0, Evaluated("OctoPipe", "octopipe", plan, sim, True))
        st.history.append({"t_s": st.elapsed(), "iteration": st.outcome.iterations,
                           "makespan_s": float(sim.makespan), "move": what, "candidate": ""})


def checks(st: TuneState) -> Evaluated:
    """Checks: the first finalist, in rank order, that passes the memory and SMT deadlock checks
    (SMT on tables up to `Budgets.smt_max_actions`)."""
    for ev in st.finals:
        if not ev.feasible:
            break
        ev = safe(st.problem, ev, st.budgets.smt_max_actions)
        if ev.feasible:
            return ev
    notes = "; ".join(sorted({e.note for e in st.finals if e.note})) or "no candidate completed"
    raise InfeasibleError(f"no plan for {st.whole.n_devices} devices × {st.whole.n_microbatches} "
                          f"micro-batches passes the checks ({notes}); try more devices or fewer "
                          "micro-batches")


def result(st: TuneState) -> TuneResult:
    """The chosen plan with its figures, bounds and the record of every stage."""
    chosen, outcome = st.chosen, st.outcome
    tokens = st.problem.n_microbatches * float(st.whole.costs.tokens_per_microbatch)
    stats = {"stopped_by": "time_cap" if st.capped else outcome.stop_reason,
             "evaluations": outcome.evaluations, "max_evaluations": st.budgets.evaluations,
             "work_actions": outcome.work,
             "iterations": outcome.iterations, "search_stopped_by": outcome.stop_reason,
             "polish_stopped_by": st.polish_stop or "not run", "capped_stages": list(st.capped),
             "time_cap_s": st.budgets.cap_s, "estimate_s": outcome.best_makespan,
             "memory_lower_bound_s": memory_lower_bound(st),
             **({"robust": st.robust} if st.robust else {})}
    on = st.problem_of(chosen.plan)
    elapsed = st.elapsed()              # the search's time: the bound below is the report's
    fd = emitted_fill_drain(st)
    contiguous = min(contiguous_bound(pb) for pb in _emitted_problems(st))
    return TuneResult(chosen.plan, chosen.sim, chosen, st.history, st.baselines, elapsed,
                      lower_bound(st.whole.layer_work(), st.whole.n_microbatches), tokens,
                      layer_bound(on), stats, st.ilp, on.costs, dict(st.counts), fd, contiguous,
                      plan_layout_bound(on, chosen.plan))


def memory_lower_bound(st: TuneState) -> float:
    """The strongest bound this run proves under its memory, over every plan it may emit: per
    layer set (whole or pieces), the largest of total work / devices, the fill/drain bound and the
    memory bound (`bounds.memory_bound`); the least over the layer sets."""
    out = []
    for pb in _emitted_problems(st):
        fd = fill_drain(pb, max_cells=0)
        out.append(max(lower_bound(pb.layer_work(), pb.n_microbatches), fd.bound_s, memory_bound(pb)))
    return min(out)


def _emitted_problems(st: TuneState) -> list[Problem]:
    """The layers a plan of this run may have: the whole ones (baselines) and the searched pieces."""
    return [st.whole] + ([st.problem] if st.counts else [])


def emitted_fill_drain(st: TuneState) -> FillDrain:
    """The fill/drain bound (with the memory bound) over every plan this run may emit: the
    baselines' on the whole layers and the search's on its pieces, so the lesser of the two.
    Closed form only (`max_cells=0`): a report figure must stay cheap and the same at any load,
    and the exact MILP's solves (up to a minute each) would dominate small runs."""
    out = []
    for pb in _emitted_problems(st):
        fd = fill_drain(pb, max_cells=0)
        mem = memory_bound(pb)
        out.append(fd if fd.bound_s >= mem else FillDrain(mem, "memory_bound", max(fd.partition_s, mem)))
    return min(out, key=lambda x: x.bound_s)


# ---------------------------------------------------------------------------------------------
# Helpers of the stages


def _progress(show: bool, budget: int):
    """A context giving the search's progress callback: a rich bar when `show`, else None."""
    if not show:
        return nullcontext(None)
    from rich.progress import (  # only for a terminal bar
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    @contextmanager
    def bar() -> Iterator[Callable[[int, float, int], None]]:
        with Progress(TextColumn("[bold]tuning[/]"), BarColumn(), TextColumn("{task.description}"),
                      TimeElapsedColumn(), transient=True) as prog:
            task = prog.add_task("", total=budget)

            def update(evaluations: int, best: float, it: int) -> None:
                prog.update(task, completed=min(evaluations, budget),
                            description=f"best {best * 1e3:.1f} ms · iter {it}")
            yield update
    return bar()
