"""How far plans are from the best table under a memory budget, on instances small enough to
search exhaustively.

`python -m octopipe.measure.bench.memory_optimality [--quick]` builds small pipelines (one
stage per device, p = 2..4, m = 2..6) with equal stages at F = I = W, with zero-bubble's GPT
ratios, and with random integer times; for each budget (1 and 2 x S-1F1B's activations, the
`tuner.memory_budget` of zero-bubble's ZB-1p and ZB-2p, and none) it finds the shortest table
of all (`solvers.exhaustive_tables`) and sets beside it OctoPipe's tuner
(`tuner.levers=[schedule]` at the same budget, as `octopipe.measure.bench.zero_bubble` runs
it), zero-bubble's automatic scheduler (`solvers.zb_auto`) and the tuner's
`memory_lower_bound_s`. Every makespan is the simulator's (strict dispatch, eager messages).
Writes runs/bench/memory_optimality/results.json and table.md and prints the table.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError
from octopipe.io import write_text
from octopipe.measure.bench.zero_bubble import rows_plan, zb_instance
from octopipe.schedule.action import B, F, I, W
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.simulator import simulate
from octopipe.tune import TuneOptions, tune
from solvers.exhaustive_tables import exhaustive_table, time_rows
from solvers.zb_auto import ZbInstance, zb_auto_schedule

EVALUATIONS = 400
MAX_STATES = 150_000    # states the search may expand per case; a case it stops is "not proven"
GPT_RATIO = (1.0, 1.1, 0.9)     # F : I : W of a GPT layer (24bsh² GEMMs each, attention in F, I)


@dataclass(frozen=True)
class Case:
    """One small instance: per-stage F, I, W seconds, activation bytes per micro-batch (`act`,
    of which `act_w` stays from I to W), the link time, micro-batches and the budget as a
    multiple of S-1F1B's activations (None: no budget)."""

    name: str
    f: tuple[float, ...]
    i: tuple[float, ...]
    w: tuple[float, ...]
    act: tuple[float, ...]
    act_w: tuple[float, ...]
    comm: float
    m: int
    multiple: float | None

    @property
    def p(self) -> int:
        return len(self.f)


def costs_of(case: Case) -> CostTable:
    """The case as a cost table: one layer per stage, no static bytes, no message bytes (the
    link's latency is the transfer time)."""
    p = case.p
    arr = lambda x: np.asarray(x, dtype=np.float64)
    return CostTable(tuple(f"stage{s}" for s in range(p)), ("gpu",), arr(case.f), arr(case.i),
                     arr(case.w), arr(case.act), np.zeros(p), np.zeros(p), np.zeros(p),
                     w_act_bytes=arr(case.act_w))


def cluster_of(case: Case) -> Cluster:
    """`p` devices without a memory limit, links that take `comm` seconds for any message."""
    dk = DeviceKind("gpu", 1e15, 1e18, 1e12)
    link = Link("link", 1e30, case.comm)
    return Cluster("small", (dk,), (0,) * case.p, (0,) * case.p, link, link)


def instance_of(case: Case) -> ZbInstance:
    """The case at its budget in bytes per device (`activation_budget`, as the tuner sets it)."""
    return zb_instance(costs_of(case), case.m, case.multiple, case.comm)


@dataclass(frozen=True)
class Row:
    """One case: the exhaustive optimum, the tuner's plan, zero-bubble's scheduler (None when
    its greedy cannot fit the budget) and the tuner's memory lower bound, in seconds."""

    name: str
    p: int
    m: int
    budget: str
    optimum: float
    tuner: float
    zb_auto: float | None
    memory_lower_bound: float
    tuner_over_optimum: float
    proven: bool
    nodes: int
    search_s: float
    tune_s: float


def rows_of(table: ScheduleTable) -> tuple[tuple[tuple[int, int], ...], ...] | None:
    """A one-stage-per-device table as (kind, micro-batch) rows, each B as I then W; None for
    another layout."""
    if table.placement != tuple(range(table.n_devices)):
        return None
    code = {F: ((0,),), I: ((1,),), W: ((2,),), B: ((1,), (2,))}
    return tuple(tuple((k[0], a.microbatch) for a in table.actions(d) for k in code[a.kind])
                 for d in range(table.n_devices))


def zb_rows(inst: ZbInstance):
    """zero-bubble's automatic scheduler's rows, or None when its greedy cannot fit the budget."""
    try:
        return zb_auto_schedule(inst).rows
    except InfeasibleError:
        return None


def best_known(inst: ZbInstance, candidates: list) -> tuple | None:
    """The shortest of the candidate tables that fit (the search's incumbent)."""
    timed = []
    for rows in candidates:
        if rows is None:
            continue
        try:
            timed.append((time_rows(inst, rows), rows))
        except InfeasibleError:
            continue
    return min(timed, key=lambda x: x[0])[1] if timed else None


def compare(case: Case, evaluations: int = EVALUATIONS, max_states: int = MAX_STATES) -> Row:
    """The exhaustive optimum of one case beside the tuner, zero-bubble's scheduler and the
    bound. The search starts from the better of the two plans' tables (it stays exact), and
    its table is re-timed by the simulator and checked against the budget."""
    inst, costs, cl = instance_of(case), costs_of(case), cluster_of(case)
    opts = {"levers": ["schedule"], "max_evaluations": evaluations}
    if case.multiple is not None:
        opts["memory_budget"] = case.multiple
    t0 = time.process_time()
    res = tune(costs, cl, case.p, case.m, TuneOptions(opts))
    tune_s = time.process_time() - t0
    zb = zb_rows(inst)
    t0 = time.process_time()
    best = exhaustive_table(inst, max_states, best_known(inst, [zb, rows_of(res.plan.table)]))
    search_s = time.process_time() - t0
    sim = simulate(rows_plan(best.rows, case.m, "exhaustive"), costs, cl)
    if abs(sim.makespan - best.makespan) > 1e-9 * best.makespan or \
            sim.peak_activation_memory.max() > inst.max_mem[0] * (1 + 1e-9):
        raise InfeasibleError(f"{case.name}: the optimum's table times to {sim.makespan} (search "
                              f"{best.makespan}) at peak {sim.peak_activation_memory.max()}")
    zb_s = None if zb is None else simulate(rows_plan(zb, case.m, "zb_auto"), costs,
                                            cl).makespan
    ours = res.sim_result.makespan
    return Row(case.name, case.p, case.m, "none" if case.multiple is None else f"{case.multiple:g}x",
               best.makespan, ours, zb_s, float(res.search_stats["memory_lower_bound_s"]),
               ours / best.makespan - 1, best.proven, best.nodes, search_s, tune_s)


def equal_case(p: int, m: int, multiple: float | None) -> Case:
    """Equal stages, F = I = W = 1, the activations all freed by I, free links."""
    return Case("equal 1:1:1", (1.0,) * p, (1.0,) * p, (1.0,) * p, (1.0,) * p, (0.0,) * p, 0.0,
                m, multiple)


def gpt_case(p: int, m: int, multiple: float | None) -> Case:
    """Equal stages at a GPT layer's F : I : W, 37% of the activations held from I to W (M_W /
    M_F of the 1.5B setting) and a link at 5% of F (`octopipe.measure.bench.zero_bubble`)."""
    f, i, w = GPT_RATIO
    return Case("gpt ratios", (f,) * p, (i,) * p, (w,) * p, (1.0,) * p, (0.37,) * p, 0.05 * f, m,
                multiple)


def random_case(p: int, m: int, multiple: float | None, seed: int) -> Case:
    """Integer times 1..3 per stage and kind, activations 1 or 2 per stage (half held to W or
    none), a link of 0 or 1."""
    rng = np.random.default_rng(seed)
    f, i, w = (tuple(float(x) for x in rng.integers(1, 4, p)) for _ in range(3))
    act = tuple(float(x) for x in rng.integers(1, 3, p))
    half = bool(rng.integers(0, 2))
    act_w = tuple(a / 2 if half else 0.0 for a in act)
    return Case(f"random {seed}", f, i, w, act, act_w, float(rng.integers(0, 2)), m, multiple)


def grid(quick: bool) -> list[Case]:
    """The cases: p = 2 and 3 with m from p to 6, p = 4 with m = 4 and 5 (quick: a few), budgets
    1x, 2x and none."""
    shapes = ((2, 4), (3, 3), (3, 4), (4, 4)) if quick else \
        tuple((p, m) for p in (2, 3, 4) for m in range(p, 7 if p < 4 else 6))
    out = []
    for p, m in shapes:
        for multiple in (1.0, 2.0, None):
            out += [equal_case(p, m, multiple), gpt_case(p, m, multiple)]
            out += [random_case(p, m, multiple, seed) for seed in ((1,) if quick else (1, 2))]
    return out


def table_md(rows: list[Row]) -> str:
    head = ("| case | p | m | budget | optimum | tuner | zb_auto | memory bound | tuner over "
            "optimum | states |\n|---|---|---|---|---|---|---|---|---|---|\n")
    zb = lambda x: "infeasible" if x is None else f"{x:.4g}"
    return head + "".join(
        f"| {r.name} | {r.p} | {r.m} | {r.budget} | {r.optimum:.4g} | {r.tuner:.4g} | "
        f"{zb(r.zb_auto)} | {r.memory_lower_bound:.4g} | {r.tuner_over_optimum:.2%} | "
        f"{r.nodes}{'' if r.proven else ' (not proven)'} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p, m in (2, 4), (3, 3), (3, 4), (4, 4)")
    ap.add_argument("--out", default="runs/bench/memory_optimality")
    ap.add_argument("--evaluations", type=int, default=EVALUATIONS)
    ap.add_argument("--max-states", type=int, default=MAX_STATES)
    args = ap.parse_args(argv)
    rows = []
    for case in grid(args.quick):
        r = compare(case, args.evaluations, args.max_states)
        print(f"{r.name:12s} p={r.p} m={r.m} {r.budget:4s} optimum {r.optimum:8.4g}  tuner "
              f"{r.tuner:8.4g}  zb {r.zb_auto if r.zb_auto is None else round(r.zb_auto, 4)}  "
              f"bound {r.memory_lower_bound:8.4g}  ({r.nodes} states, {r.search_s:.1f} s; "
              f"tune {r.tune_s:.1f} s)", flush=True)
        rows.append(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "results.json", json.dumps([asdict(r) for r in rows], indent=1))
    md = table_md(rows)
    write_text(out / "table.md", md)
    print(md)
    worse = [r for r in rows if r.tuner_over_optimum > 1e-9]
    print(f"{len(rows)} cases; the tuner is above the optimum in {len(worse)}; wrote "
          f"{out}/results.json and table.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
