"""Iterated local search over candidates, ranked by the list-scheduling estimator.

simulate (estimate) → attribute → moves aimed at the largest cause → rank cheaply (bubble
pressure, static balance) → estimate the best few → keep an improvement; at a local optimum kick
the best candidate (random moves) or restart from the next seed; stop at convergence (patience
exhausted and every seed restarted from: `converged`), the iteration or evaluation budget
(`iterations`) or the wall-clock safety cap (`time_cap`). Every random choice follows `seed` and
every budget counts work, not seconds: two runs with the same seed give the same plan at any
machine load, unless the safety cap stopped one of them (and the outcome says so).
"""
from __future__ import annotations

import gc
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from octopipe.config.tuner import TunerConfig
from octopipe.errors import InfeasibleError
from octopipe.plan import Partition
from octopipe.schedule.table import loop_placement, v_placement
from octopipe.tune.attribution import from_list_result
from octopipe.tune.balance import lpt_placement, refine_balance
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.layout_bound import layout_bound
from octopipe.tune.levers import Levers
from octopipe.tune.moves import neighbours, perturb


@dataclass(frozen=True)
class SearchConfig:
    """The search's part of TunerConfig (defaults, docs and ranges there)."""

    time_budget_s: float = TunerConfig.time_budget_s     # the safety cap of this stage
    max_evaluations: int = TunerConfig.max_evaluations
    max_work: int = TunerConfig.max_work
    max_iters: int = TunerConfig.max_iters
    patience: int = TunerConfig.patience
    candidates_per_iter: int = TunerConfig.candidates_per_iter
    kick_strength: int = TunerConfig.kick_strength
    max_chunks: int = TunerConfig.max_chunks

    @classmethod
    def of(cls, tuner: TunerConfig) -> SearchConfig:
        return cls(**{f.name: getattr(tuner, f.name) for f in fields(cls)})


@dataclass
class SearchOutcome:
    best: Candidate
    best_makespan: float
    history: list[dict] = field(default_factory=list)
    pool: list[tuple[float, Candidate]] = field(default_factory=list)   # best distinct, ascending
    evaluations: int = 0
    work: int = 0                       # actions the estimates scheduled
    iterations: int = 0
    stop_reason: str = ""
    # no schedule of `best`'s partition and placement is shorter (octopipe.tune.layout_bound):
    # when it equals best_makespan, only the layout (or splitting a layer) can do better
    layout_bound_s: float = math.nan


def seed_candidates(problem: Problem, max_chunks: int = 8) -> list[Candidate]:
    """Starting points: loop (1F1B / interleaved) and V placements on balanced stages, and
    longest-processing-time placements of balanced stages (down to one layer per stage)."""
    return list(iter_seed_candidates(problem, max_chunks))


def iter_seed_candidates(problem: Problem, max_chunks: int = 8) -> Iterator[Candidate]:
    """`seed_candidates` one stage count at a time, so that a search whose work budget ends
    after the first seeds does not balance the placements of the rest."""
    D, L = problem.n_devices, problem.n_layers
    work = problem.layer_work().mean(axis=1)
    ps = np.concatenate([[0.0], np.cumsum(work)])
    counts = sorted({D * v for v in range(1, max_chunks + 1) if D * v <= L}
                    | {min(L, max(D, int(round(L * f)))) for f in (0.5, 0.75, 1.0)})
    for S in counts:
        part = Partition.balanced(work, S)
        fams = []
        if S % D == 0:
            v = S // D
            fams.append((f"loop{v}", loop_placement(D, v)))
            if v >= 2:
                fams.append((f"v{v}", v_placement(D, v)))
        sw = ps[part.bounds[1:]] - ps[part.bounds[:-1]]
        lpt = lpt_placement(sw, D)
        fams.append((f"lpt{S}", lpt))
        fams.append((f"lpt{S}+", refine_balance(sw, lpt, D)))
        for fam, pl in list(fams[:2]):
            if fam.startswith(("loop", "v")):
                fams.append((fam + "+", refine_balance(sw, pl, D)))
        for fam, pl in fams:
            for split_backward in (True, False):
                for infl in (1.0, 2.0, math.inf):
                    yield Candidate(part, pl, split_backward, infl, origin=fam)


class Evaluator:
    """Cached estimator calls, counted, and the actions they scheduled (`work`).

    `batch` may stop an estimate early once it provably exceeds what could still matter (see
    there); such a candidate is cached as NaN, counted like any other, and estimated in full
    (uncounted, as a cache hit would be) if its value is ever asked for."""

    def __init__(self, problem: Problem, pool_size: int = 8, admits: Callable[[Candidate], bool] | None = None):
        self.problem = problem
        self.admits = admits        # a candidate it refuses is infeasible (estimated inf, counted)
        self.cache: dict[Candidate, float] = {}
        self.calls = 0
        self.work = 0
        self.pool_size = max(1, pool_size)
        self._top: list[float] = []     # max-heap (negated) of the pool_size smallest known values

    def _estimate(self, c: Candidate, bound: float) -> float:
        self.calls += 1
        self.work += c.n_stages * self.problem.n_microbatches * (3 if c.split_backward else 2)
        v = self.problem.estimate_makespan(c, bound) if self.admits is None or self.admits(c) else math.inf
        self._known(c, v)
        return v

    def _known(self, c: Candidate, v: float) -> None:
        self.cache[c] = v
        if math.isfinite(v):
            if len(self._top) < self.pool_size:
                heapq.heappush(self._top, -v)
            elif v < -self._top[0]:
                heapq.heapreplace(self._top, -v)

    def pool_threshold(self) -> float:
        """The pool_size-th smallest value known (inf while fewer are): a candidate above it
        never enters `pool` (later values only lower it, and ties keep the earlier)."""
        return -self._top[0] if len(self._top) >= self.pool_size else math.inf

    def __call__(self, c: Candidate) -> float:
        v = self.cache.get(c)
        if v is None:
            return self._estimate(c, math.inf)
        if math.isnan(v):
            v = self.problem.estimate_makespan(c) if self.admits is None or self.admits(c) else math.inf
            self._known(c, v)
        return v

    def bounded(self, c: Candidate, bound: float) -> float:
        """Estimate `c` (not cached), or NaN once it provably exceeds `bound`."""
        return self._estimate(c, bound)

    def batch(self, xs: Sequence[Candidate], incumbent: float) -> list[float]:
        """Estimate `xs` (none cached) in order; an entry is NaN when that estimate stopped
        early above max(min(incumbent, the smallest earlier value), pool_threshold()). Such a
        candidate can be neither the batch's first minimum below `incumbent` nor in `pool`, so
        the search decides as if every value were known."""
        vals, low = [], incumbent
        for x in xs:
            v = self.bounded(x, max(low, self.pool_threshold()))
            if v < low:
                low = v
            vals.append(v)
        return vals

    def pool(self, k: int) -> list[tuple[float, Candidate]]:
        ranked = sorted(((v, c) for c, v in self.cache.items() if math.isfinite(v)),
                        key=lambda t: t[0])
        return ranked[:k]


def search(problem: Problem, starts: Sequence[Candidate], cfg: SearchConfig, seed: int = 0,
           on_progress: Callable[[int, float, int], None] | None = None,
           pool_size: int = 8, levers: Levers | None = None) -> SearchOutcome:
    """Improve on `starts` (plus the named-family seeds) within the config's budgets;
    `on_progress(evaluations, best makespan, iteration)` after every iteration. With `levers`,
    every candidate is projected onto them (the levers that are off keep the reference's
    values)."""
    # the caller's objects outlive the search: keep the cyclic collector off them (it rescanned
    # every module's objects while the search allocates its candidates; results are unaffected)
    gc.freeze()
    try:
        return _search(problem, starts, cfg, seed, on_progress, pool_size, levers)
    finally:
        gc.unfreeze()


def _search(problem: Problem, starts: Sequence[Candidate], cfg: SearchConfig, seed: int,
            on_progress: Callable[[int, float, int], None] | None, pool_size: int,
            levers: Levers | None) -> SearchOutcome:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ev = Evaluator(problem, pool_size, None if levers is None or levers.has("schedule") else
                   (lambda c: levers.admits(problem, c)))
    project = levers.project if levers is not None else (lambda c: c)
    seeds = (project(c) for c in itertools.chain(starts, iter_seed_candidates(problem,
                                                                               cfg.max_chunks)))
    first = []          # the seeds in order, until the work budget is spent (at least one fits)
    seen: set[Candidate] = set()
    for c in seeds:
        if c is None or c in seen:
            continue
        if ev.work >= cfg.max_work and any(math.isfinite(v) for v, _, _ in first):
            break
        seen.add(c)
        # above the pool's threshold a seed is neither the best nor in the pool: its estimate
        # may stop early (NaN); only the restarts need its value, and they estimate it in full
        first.append((ev.bounded(c, ev.pool_threshold()), len(first), c))
    scored = sorted(((v, k, c) for v, k, c in first if not math.isnan(v)), key=lambda t: (t[0], t[1]))
    scored = [(v, c) for v, _, c in scored if math.isfinite(v)]
    if not scored:
        raise_infeasible(problem, levers)
    best_ms, best = scored[0]
    history = [{"t_s": time.perf_counter() - t0, "iteration": 0, "makespan_s": best_ms,
                "move": f"start ({best.origin or 'seed'})", "candidate": best.describe()}]
    restarts: list[Candidate] | None = None        # built by the first iteration that runs
    cur, cur_ms = best, best_ms
    since_best = 0
    it = 0
    stop = "converged"
    per_iter = max(cfg.candidates_per_iter, 1)
    while True:
        it += 1
        elapsed = time.perf_counter() - t0
        if elapsed > cfg.time_budget_s:
            stop = "time_cap"
            break
        if it > cfg.max_iters or ev.calls >= cfg.max_evaluations or ev.work >= cfg.max_work:
            stop = "iterations"
            break
        if restarts is None:
            restarts = restart_order(ev, first, best)
        if since_best >= cfg.patience and not restarts:
            stop = "converged"
            break
        res = problem.estimate(cur)
        attr = from_list_result(problem, cur, res)
        moves = neighbours(cur, problem, attr)
        if levers is not None and not levers.all:
            moves = [(x, b, tag) for x, b, tag in ((project(x), b, tag) for x, b, tag in moves)
                     if x is not None]
        # estimate more moves per iteration on small instances (a function of the size only, so
        # that a seeded search not stopped by the clock is reproducible)
        n_actions = cur.n_stages * problem.n_microbatches * 3
        width = int(np.clip(2e6 / n_actions, per_iter, 400))
        width = min(width, cfg.max_evaluations - ev.calls)
        picked: dict[Candidate, str] = {}        # distinct unestimated moves, in move order
        for x, _, tag in moves:
            if len(picked) < width and x not in ev.cache and x not in picked:
                picked[x] = tag
        fresh = list(picked.items())
        improved = False
        if fresh:
            got = ev.batch([x for x, _ in fresh], cur_ms)
            vals = [(v, k, x, tag) for k, (v, (x, tag)) in enumerate(zip(got, fresh))
                    if not math.isnan(v)]
            v, _, x, tag = min(vals, key=lambda t: (t[0], t[1])) if vals else (math.inf, 0, cur, "")
            if v < cur_ms * (1 - 1e-9):
                cur, cur_ms, improved = x, v, True
                if v < best_ms * (1 - 1e-9):
                    best, best_ms = x, v
                    since_best = 0
                    history.append({"t_s": time.perf_counter() - t0, "iteration": it,
                                    "makespan_s": v, "move": tag, "candidate": x.describe()})
        if not improved:
            since_best += 1
            # restart from an unexplored seed now and then; past the patience, every third
            # iteration until the seeds run out (then the search has converged)
            if restarts and (since_best % 4 == 2 or (since_best >= cfg.patience and since_best % 3 == 0)):
                cur = restarts.pop(0)
            else:
                cur = project(perturb(best, problem, rng, cfg.kick_strength + int(rng.integers(3)))) or best
            cur_ms = ev(cur)
            if not math.isfinite(cur_ms):
                cur, cur_ms = best, best_ms
        elif cur is not best:
            since_best += 1
        if on_progress is not None:
            on_progress(ev.calls, best_ms, it)
    return SearchOutcome(best, best_ms, history, ev.pool(pool_size), ev.calls, ev.work, it, stop,
                         layout_bound(problem, best).makespan_s)


def restart_order(ev: Evaluator, first: list[tuple[float, int, Candidate]],
                  best: Candidate) -> list[Candidate]:
    """The seeds other than `best` (finite, ascending, ties in seed order), distinct families
    first; `first` is (estimate or NaN, seed index, seed) in seed order."""
    exact = sorted(((ev(c) if math.isnan(v) else v, k, c) for v, k, c in first),
                   key=lambda t: (t[0], t[1]))
    restarts = [c for v, _, c in exact if math.isfinite(v)][1:]
    seen_origin = {best.origin}
    restarts.sort(key=lambda c: (c.origin in seen_origin, ev(c)))
    return restarts


def fmt_bytes(x: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1 (GiB at most)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def raise_infeasible(problem: Problem, levers: Levers | None = None) -> None:
    if levers is not None and not levers.has("schedule"):
        D = problem.n_devices
        raise InfeasibleError(
            f"no partition fits memory in S-1F1B's order, which tuner.levers={sorted(levers.on)} keeps (the "
            f"schedule lever is off): stage s of {D} holds min({D} - s, {problem.n_microbatches}) micro-batches' "
            f"activations; add schedule to tuner.levers (or use more devices or recomputation)")
    if problem.act_budget is not None:
        D = problem.n_devices
        st = problem.stages(Candidate(Partition.uniform(problem.n_layers, D), tuple(range(D))))
        short = st.act_bytes - problem.act_budget
        d = int(np.argmax(short))
        raise InfeasibleError(
            f"no schedule fits tuner.memory_budget ({fmt_bytes(problem.act_budget[d])} of "
            f"activations per device): on uniform stages, device {d} needs "
            f"{fmt_bytes(st.act_bytes[d])} for one micro-batch in flight "
            f"(short by {fmt_bytes(max(0.0, short[d]))}) and no searched partition fits "
            f"either; raise the budget or use more devices")
    need = problem.costs.static_bytes.sum()
    act = problem.costs.act_bytes.sum()      # one micro-batch's, all live before its first backward
    have = problem.memory_bytes.sum()
    raise InfeasibleError(
        f"no candidate fits memory: the model's parameters, gradients and optimizer state need "
        f"{need / 2**30:.1f} GiB and one micro-batch's activations {act / 2**30:.1f} GiB, "
        f"{(need + act) / 2**30:.1f} GiB at least, against {have / 2**30:.1f} GiB on "
        f"{problem.n_devices} "
        f"devices{'' if need + act > have else ' (and no layout holds the micro-batches its schedule keeps in '}"
        f"{'' if need + act > have else 'flight)'}; "
        "use more devices (pp), recomputation (cost.recompute), a "
        f"shorter model.seq_len or fewer micro-batches in flight")
