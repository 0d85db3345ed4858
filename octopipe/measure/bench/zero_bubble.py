"""Memory-budget plans against zero-bubble's automatic scheduler (ZB-1p / ZB-2p).

`python -m octopipe.measure.bench.zero_bubble [--quick]` rebuilds the GPT settings of Qi et al.
2024 (1.5B and 6.2B on p = 8, 14.6B on p = 16, 28.3B on p = 32; m = 3p, 4p, 8p) as cost tables
with one stage per device, tunes each with `tuner.levers=[schedule]` at `tuner.memory_budget`
1 and 2 (p·M_F and 2p·M_F, zero-bubble's budgets), runs the independent re-implementation of
zero-bubble's scheduler (`solvers.zb_auto`) at the same budgets, and writes both bubble rates
(ours: idle share of the makespan; theirs: idle share of the longest stage's own span) to
runs/bench/zero_bubble/. The paper's profiled T_F, T_B, T_W, T_comm were not available, so the
times are derived from each model's FLOPs at a stated rate (`GptSetting`); the "padded"
variant is the paper's layout (L = kp - 2: first and last stage one layer less, plus the
embedding and the LM head), so its stages are unequal.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.io import write_text
from octopipe.plan import Partition, Plan
from octopipe.schedule.action import Action, F, I, W
from octopipe.schedule.table import ScheduleTable, loop_placement
from octopipe.sim.simulator import simulate
from octopipe.sim.stage_span import span_bubble_rate
from octopipe.tune import TuneOptions, tune
from octopipe.tune.candidate import Problem
from octopipe.tune.memory_budget import activation_budget
from solvers.zb_auto import ZbInstance, zb_auto_schedule

RATE = 312e12 * 0.5     # A100 bf16 peak at 50% MFU, FLOP/s
LINK_BW, LINK_LAT = 50e9, 2e-5
VOCAB = 50257
EVALUATIONS = 3000


@dataclass(frozen=True)
class GptSetting:
    """One of the paper's GPT settings: layers, heads, hidden, sequence, stages, micro-batch."""

    name: str
    layers: int
    heads: int
    hidden: int
    seq: int
    stages: int
    mb_size: int

    def layer_times(self) -> tuple[float, float, float]:
        """F, B (input gradient) and W of one layer: 24bsh² of GEMMs each, attention's 4bs²h in
        F and twice that in B (it has no weights)."""
        b, s, h = self.mb_size, self.seq, self.hidden
        gemm, attn = 24 * b * s * h * h, 4 * b * s * s * h
        return (gemm + attn) / RATE, (gemm + 2 * attn) / RATE, gemm / RATE

    def layer_bytes(self) -> tuple[float, float]:
        """M_F = (34h + 5as)·bs and M_W = 32h·bs (zero-bubble's memory model)."""
        tokens = self.mb_size * self.seq
        return (34 * self.hidden + 5 * self.heads * self.seq) * tokens, 32 * self.hidden * tokens

    def comm(self) -> float:
        return 2 * self.mb_size * self.seq * self.hidden / LINK_BW + LINK_LAT


SETTINGS = (GptSetting("1.5B", 22, 24, 2304, 1024, 8, 6),
            GptSetting("6.2B", 30, 64, 4096, 1024, 8, 3),
            GptSetting("14.6B", 46, 40, 5120, 1024, 16, 1),
            GptSetting("28.3B", 62, 48, 6144, 1024, 32, 1))


def stage_costs(g: GptSetting, padded: bool) -> CostTable:
    """One row per stage. Uniform: L/p layers each. Padded (the paper's layout, L = kp - 2): the
    first and last stages hold one layer less, the first adds the embedding (bsh per pass), the
    last the LM head and loss (2bshV per pass, F, B and W alike)."""
    p = g.stages
    per = np.full(p, g.layers / p)
    if padded:
        per = np.full(p, (g.layers + 2) / p)
        per[[0, -1]] -= 1
    t, x = g.layer_times(), g.layer_bytes()
    f, b, w = (per[:, None] * v for v in t)
    mf, mw = per * x[0], per * x[1]
    if padded:
        tok_h = g.mb_size * g.seq * g.hidden
        lm = 2 * tok_h * VOCAB / RATE
        f[-1] += lm
        b[-1] += lm
        w[-1] += lm
        f[0] += tok_h / RATE
    out = np.full(p, 2.0 * g.mb_size * g.seq * g.hidden)
    return CostTable(tuple(f"stage{s}" for s in range(p)), ("gpu",), f, b, w, mf, np.zeros(p),
                     out, np.zeros(p), w_act_bytes=mw, tokens_per_microbatch=g.mb_size * g.seq)


def setting_cluster(p: int) -> Cluster:
    """`p` devices without a memory limit (the budget is the tuner's), links at LINK_BW."""
    dk = DeviceKind("gpu", RATE, 1e18, 2e12)
    link = Link("link", LINK_BW, LINK_LAT)
    return Cluster("zb", (dk,), (0,) * p, (0,) * p, link, link)


def zb_instance(costs: CostTable, m: int, multiple: float | None, comm: float) -> ZbInstance:
    """zero-bubble's instance at `multiple` x 1F1B's activations (the tuner's budget; None: no
    budget) for one layer per stage."""
    p = len(costs.layer_names)
    if multiple is None:
        budget = math.inf
    else:
        budget = float(activation_budget(Problem.build(costs, setting_cluster(p), p, m), multiple)[0])
    tup = lambda x: tuple(float(v) for v in np.ravel(x))
    return ZbInstance(tup(costs.f), tup(costs.i), tup(costs.w), tup(costs.act_bytes),
                      tup(costs.w_act_bytes), (budget,) * p, comm, m)


def rows_plan(rows, m: int, name: str) -> Plan:
    """(kind, micro-batch) rows, kind 0/1/2 = F/I/W (zero-bubble's form), as a plan with one
    stage per device for our simulator."""
    p = len(rows)
    table = ScheduleTable.from_rows([[Action(s, (F, I, W)[k], mb) for k, mb in rows[s]] for s in range(p)],
                                    loop_placement(p, 1), m, name)
    return Plan(Partition.uniform(p, p), table)


def oracle_plan(inst: ZbInstance) -> Plan:
    """zero-bubble's schedule as a plan (one stage per device) for our simulator."""
    return rows_plan(zb_auto_schedule(inst).rows, inst.n_microbatches, "zb_auto")


@dataclass(frozen=True)
class Row:
    model: str
    variant: str
    p: int
    m: int
    budget: float
    zb_makespan_ms: float
    zb_bubble: float
    zb_span_bubble: float
    ours_makespan_ms: float
    ours_bubble: float
    ours_span_bubble: float
    ours_peak_over_budget: float
    ours_stopped_by: str
    ours_origin: str
    tune_s: float


def compare(g: GptSetting, m: int, multiple: float, padded: bool, evaluations: int) -> Row:
    """Tune one setting at one budget and run zero-bubble's scheduler on it."""
    costs, cl = stage_costs(g, padded), setting_cluster(g.stages)
    inst = zb_instance(costs, m, multiple, g.comm())
    zb = simulate(oracle_plan(inst), costs, cl)
    t0 = time.process_time()
    res = tune(costs, cl, g.stages, m, TuneOptions(
        {"memory_budget": multiple, "levers": ["schedule"], "max_evaluations": evaluations}))
    sim = res.sim_result
    return Row(g.name, "padded" if padded else "uniform", g.stages, m, multiple,
               zb.makespan * 1e3, zb.bubble_ratio, span_bubble_rate(zb), sim.makespan * 1e3,
               sim.bubble_ratio, span_bubble_rate(sim),
               float(sim.peak_activation_memory.max() / inst.max_mem[0]),
               str(res.search_stats.get("stopped_by", "")), str(res.plan.meta.get("origin", "")),
               time.process_time() - t0)


def table_md(rows: list[Row]) -> str:
    head = ("| model | stages | p | m | budget | ZB makespan ms | ours ms | ZB bubble | ours "
            "bubble | ZB span bubble | ours span bubble |\n|---|---|---|---|---|---|---|---|---|"
            "---|---|\n")
    return head + "".join(
        f"| {r.model} | {r.variant} | {r.p} | {r.m} | {r.budget:g}x | {r.zb_makespan_ms:.2f} | "
        f"{r.ours_makespan_ms:.2f} | {r.zb_bubble:.2%} | {r.ours_bubble:.2%} | "
        f"{r.zb_span_bubble:.2%} | {r.ours_span_bubble:.2%} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p = 8 settings and m = 3p only")
    ap.add_argument("--out", default="runs/bench/zero_bubble")
    ap.add_argument("--evaluations", type=int, default=EVALUATIONS)
    args = ap.parse_args(argv)
    rows = []
    for g in SETTINGS:
        if args.quick and g.stages > 8:
            continue
        for k in ((3,) if args.quick else (3, 4, 8)):
            for padded in (False, True):
                for multiple in (1.0, 2.0):
                    r = compare(g, k * g.stages, multiple, padded, args.evaluations)
                    print(f"{r.model:6s} {r.variant:7s} p={r.p:2d} m={r.m:3d} {multiple:g}x  "
                          f"ZB {r.zb_makespan_ms:9.2f} ms ({r.zb_bubble:6.2%}, span "
                          f"{r.zb_span_bubble:6.2%})  ours {r.ours_makespan_ms:9.2f} ms "
                          f"({r.ours_bubble:6.2%}, span {r.ours_span_bubble:6.2%})  "
                          f"{r.tune_s:5.1f} s cpu  [{r.ours_origin}]", flush=True)
                    rows.append(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "results.json", json.dumps([asdict(r) for r in rows], indent=1))
    write_text(out / "table.md", table_md(rows))
    worse = [r for r in rows if r.ours_makespan_ms > r.zb_makespan_ms * (1 + 1e-9)]
    print(f"{len(rows)} cases, ours slower than zero-bubble's scheduler in {len(worse)}; "
          f"wrote {out}/results.json and table.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
