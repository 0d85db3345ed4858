"""Speed benchmark of the solvers: the two targets of the solvers issue, plus the joint ILP's
scaling. Results are printed and written to runs/bench/solvers.json.

1. Partition ILP, 128 layers into 16 stages, CBC, proven optimal (target < 5 s): real costs
   (the first 128 layers of the dense_128l preset, homogeneous and heterogeneous clusters) and
   random costs; the presolved ILP (incumbent windows) and the plain ILP, with the DP's optimum
   as the reference.
2. SMT deadlock check of 8-device, 64-micro-batch lowered tables (target < 10 s), and of an
   18,432-action table (zbh1, 8 devices, 128 micro-batches, 48 stages; z3 once segfaulted on it).
3. Joint partition + placement ILP: size, solve time (incumbent included, 30 s in all) and
   objective over (layers, stages, devices).

    python -m solvers.bench [--quick] [--out runs/bench]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.io import write_json
from octopipe.schedule.library import build_schedule
from octopipe.schedule.lower import lower
from solvers.backend import SolverConfig
from solvers.compare import preset_costs
from solvers.dp import dp_partition
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance
from solvers.placement_ilp import solve_placement_instance
from solvers.smt.deadlock import check_deadlock_free


def first_layers(costs: CostTable, n: int) -> CostTable:
    """The cost table of the first `n` layers."""
    cut = lambda a: None if a is None else a[:n]
    return CostTable(costs.layer_names[:n], costs.kinds, costs.f[:n], costs.i[:n], costs.w[:n],
                     costs.act_bytes[:n], costs.static_bytes[:n], costs.out_bytes[:n],
                     costs.params[:n], cut(costs.w_act_bytes), cut(costs.flops),
                     costs.tokens_per_microbatch)


def random_instance(seed: int, n_layers: int, n_devices: int, hetero: bool,
                    n_stages: int | None = None, placement=None) -> PartitionInstance:
    rng = np.random.default_rng(seed)
    kinds = ("h100", "a100")
    f = rng.uniform(0.2, 2.0, n_layers)[:, None] * np.array([1.0, 2.5])[None, :] * 1e-3
    costs = CostTable(tuple(f"l{j}" for j in range(n_layers)), kinds, f, 1.1 * f, 0.9 * f,
                      rng.uniform(1e8, 4e8, n_layers), rng.uniform(1e8, 2e9, n_layers),
                      rng.uniform(1e6, 5e7, n_layers), np.zeros(n_layers))
    dk = (DeviceKind("h100", 989e12, 80e9, 3.35e12), DeviceKind("a100", 312e12, 80e9, 2.0e12))
    cl = Cluster("bench", dk, tuple((d % 2) if hetero else 0 for d in range(n_devices)),
                 tuple(d // 8 for d in range(n_devices)), Link("nvlink", 4.5e11, 3e-6),
                 Link("ib", 5e10, 1e-5))
    S = n_stages or n_devices
    return PartitionInstance.build(costs, cl, S, placement if placement is not None else
                                   (tuple(range(n_devices)) if n_devices == S else None),
                                   inflight=[float(n_devices - d) for d in range(n_devices)])


def preset_instance(model: str, cluster: str, n_layers: int, pp: int) -> PartitionInstance:
    cl, costs = preset_costs(model, cluster, pp)
    return PartitionInstance.build(first_layers(costs, n_layers), cl, pp, tuple(range(pp)),
                                   Inflight("1f1b", 32))


def bench_partition(cfg: SolverConfig, quick: bool) -> list[dict]:
    cases = [("dense_128l[:128] h100_4x8", lambda: preset_instance("dense_128l", "h100_4x8", 128, 16)),
             ("dense_128l[:128] hetero_a100_h100",
              lambda: preset_instance("dense_128l", "hetero_a100_h100", 128, 16))]
    seeds = range(2) if quick else range(4)
    cases += [(f"random seed {s} {'hetero' if h else 'homo'}", (lambda s=s, h=h: random_instance(s, 128, 16, h)))
              for h in (False, True) for s in seeds]
    rows = []
    for label, make in cases:
        inst = make()
        ref = dp_partition(inst)
        row = {"instance": label, "n_layers": inst.n_layers, "n_stages": inst.n_stages,
               "dp_objective_s": ref.objective, "dp_time_s": ref.solve_time_s}
        variants = [("ilp", True, cfg)]
        variants.append(("ilp_plain", False, replace(cfg, time_limit_s=20.0 if quick else 60.0)))
        for name, presolve, c in variants:
            t0 = time.perf_counter()
            r = solve_instance(inst, c, presolve=presolve)
            wall = time.perf_counter() - t0
            row[f"{name}_time_s"] = wall
            row[f"{name}_proven"] = r.proven_optimal
            row[f"{name}_matches_dp"] = bool(abs(r.objective - ref.objective) <= 1e-7 * ref.objective)
            row[f"{name}_binaries"] = r.n_variables
        rows.append(row)
        print(f"  partition {label}: ilp {row['ilp_time_s']:.2f}s proven={row['ilp_proven']} "
              f"(plain {row['ilp_plain_time_s']:.2f}s proven={row['ilp_plain_proven']}), "
              f"dp {ref.solve_time_s:.3f}s", flush=True)
    return rows


def bench_smt(quick: bool) -> list[dict]:
    rows = []
    names = ("1f1b", "interleaved") if quick else ("1f1b", "interleaved", "zbh1", "zbv")
    for name in names:
        table = lower(build_schedule(name, 8, 64))
        n_cells = sum(len(table.actions(d)) for d in range(table.n_devices))
        for sem in ("eager", "rendezvous", "batched"):
            t0 = time.perf_counter()
            v = check_deadlock_free(table, sem)
            wall = time.perf_counter() - t0
            rows.append({"schedule": name, "semantics": sem, "cells": n_cells, "events": v.n_events,
                         "constraints": v.n_constraints, "deadlock_free": v.ok, "time_s": wall})
            print(f"  smt {name} 8x64 {sem}: {wall:.2f}s ({n_cells} cells, {v.n_events} events) "
                  f"deadlock_free={v.ok}", flush=True)
    return rows


def bench_smt_large() -> list[dict]:
    """The deadlock check on a tuned-size table: 18,432 compute actions in 48 stages."""
    table = build_schedule("zbh1", 8, 128, 6)
    n_actions = sum(1 for _ in table)
    rows = []
    for sem in ("eager", "rendezvous", "batched"):
        t0 = time.perf_counter()
        v = check_deadlock_free(table, sem)
        wall = time.perf_counter() - t0
        rows.append({"schedule": "zbh1", "devices": 8, "microbatches": 128, "stages": table.n_stages,
                     "semantics": sem, "actions": n_actions, "events": v.n_events,
                     "constraints": v.n_constraints, "deadlock_free": v.ok, "time_s": wall})
        print(f"  smt zbh1 8x128, 48 stages {sem}: {wall:.2f}s ({n_actions} actions, "
              f"{v.n_events} events) deadlock_free={v.ok}", flush=True)
    return rows


def bench_joint(cfg: SolverConfig, quick: bool) -> list[dict]:
    grid = [(16, 4, 2), (16, 8, 4), (32, 8, 4), (32, 8, 8), (32, 16, 8), (64, 16, 8)]
    if not quick:
        grid += [(64, 16, 4), (64, 32, 16)]
    rows = []
    c = replace(cfg, time_limit_s=30.0)
    for L, S, D in grid:
        inst = random_instance(7, L, D, True, n_stages=S)
        free = replace(inst, placement=())
        r = solve_placement_instance(free, c)
        rows.append({"n_layers": L, "n_stages": S, "n_devices": D, "n_variables": r.n_variables,
                     "n_constraints": r.n_constraints, "time_s": r.solve_time_s,
                     "proven_optimal": r.proven_optimal, "objective_s": r.objective,
                     "bound_s": r.bound, "time_limit_s": c.time_limit_s})
        print(f"  joint L={L} S={S} D={D}: {r.n_variables} vars, {r.n_constraints} cons, "
              f"{r.solve_time_s:.2f}s proven={r.proven_optimal} objective={r.objective:.6g}s",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m solvers.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances, shorter limits")
    ap.add_argument("--solver", default="cbc", choices=("cbc", "highs"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--skip", nargs="*", default=[], choices=("partition", "smt", "joint"))
    args = ap.parse_args(argv)
    cfg = SolverConfig(args.solver, 60.0)
    doc: dict = {"solver": args.solver, "quick": args.quick}
    if "partition" not in args.skip:
        print("partition ILP, 128 layers -> 16 stages (target: proven optimal in < 5 s)")
        doc["partition_128x16"] = bench_partition(cfg, args.quick)
        doc["partition_128x16_max_ilp_time_s"] = max(r["ilp_time_s"] for r in doc["partition_128x16"])
    if "smt" not in args.skip:
        print("SMT deadlock check, 8 devices x 64 micro-batches (target: < 10 s)")
        doc["smt_8x64"] = bench_smt(args.quick)
        doc["smt_8x64_max_time_s"] = max(r["time_s"] for r in doc["smt_8x64"])
        print("SMT deadlock check, 18,432 actions (8 devices x 128 micro-batches x 48 stages)")
        doc["smt_large"] = bench_smt_large()
        doc["smt_large_max_time_s"] = max(r["time_s"] for r in doc["smt_large"])
    if "joint" not in args.skip:
        print("joint partition + placement ILP scaling")
        doc["joint_scaling"] = bench_joint(cfg, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "solvers.json", doc)
    print(f"results: {args.out / 'solvers.json'}")
    return doc


if __name__ == "__main__":
    main()
