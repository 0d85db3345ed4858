"""Simulated vs measured iteration time of the runtime, per schedule.

Emulated: the default 8-rank pipeline of a heterogeneous model (analytic costs on the cluster
preset, scaled to sleepable durations) — every action sleeps its modelled time while messages
really travel over loopback gloo. Real: the tiny hybrid preset computing on 2 and 4 ranks, the
simulator fed per-layer costs calibrated in situ (`octopipe.runtime.insitu`: a separate
calibration launch of the real runtime on the same ranks), with the offline `cost=profiled`
prediction and a replay of each stage's times observed in the measured iterations beside it.
Runs alternate: each of `--rounds` rounds launches the calibration table and then every schedule
(in a rotated order), and each figure is the median over all rounds, so the load that other
work puts on the machine falls on every schedule alike. The calibration run is not one of the
predicted runs. Reported: the mean and max absolute relative error, and whether the simulator
ranks the schedules as the measurement does (exact order and Spearman).

    python -m octopipe.runtime.bench.fidelity [--skip-real] [--skip-emulated] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.fidelity import Comparison, compare, launch, summarise
from octopipe.schedule.library import build_schedule

EMULATED = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev")
REAL = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv")


def _ranking_agrees(rows: list[Comparison]) -> bool:
    measured = [c.schedule for c in sorted(rows, key=lambda c: c.measured_iteration_s)]
    simulated = [c.schedule for c in sorted(rows, key=lambda c: c.simulated_iteration_s)]
    return measured == simulated


def _spearman(rows: list[Comparison]) -> float:
    m = np.argsort(np.argsort([c.measured_iteration_s for c in rows]))
    s = np.argsort(np.argsort([c.simulated_iteration_s for c in rows]))
    n = len(rows)
    return float(1 - 6 * np.sum((m - s) ** 2) / (n * (n * n - 1))) if n > 1 else 1.0


def _group(name: str, rows: list[Comparison], extra: dict | None = None) -> dict:
    errs = [c.fidelity_error for c in rows]
    replay = [c.fidelity_error_replay for c in rows if c.fidelity_error_replay is not None]
    profiled = [c.fidelity_error_profiled for c in rows if c.fidelity_error_profiled is not None]
    out = {"setting": name, "mape": float(np.mean(errs)), "max_error": float(np.max(errs)),
           "same_ranking": _ranking_agrees(rows), "spearman": _spearman(rows),
           "schedules": [c.summary() for c in rows], **(extra or {})}
    if replay:
        out["mape_replay"] = float(np.mean(replay))
    if profiled:
        out["mape_profiled"] = float(np.mean(profiled))
        out["max_error_profiled"] = float(np.max(profiled))
        prof_rank = [c.schedule for c in sorted(rows, key=lambda c: c.simulated_profiled_s)]
        out["same_ranking_profiled"] = prof_rank == [c.schedule for c in sorted(rows, key=lambda c: c.measured_iteration_s)]
    print(f"\n{name}")
    print(f"  {'schedule':12s} {'measured s':>11s} {'simulated s':>12s} {'error':>7s} {'profiled err':>13s} {'replay err':>11s}")
    pct = lambda e: "-" if e is None else f"{100 * e:.1f}%"
    for c in rows:
        print(f"  {c.schedule:12s} {c.measured_iteration_s:11.4f} {c.simulated_iteration_s:12.4f} "
              f"{100 * c.fidelity_error:6.1f}% {pct(c.fidelity_error_profiled):>13s} {pct(c.fidelity_error_replay):>11s}")
    print(f"  MAPE {100 * out['mape']:.1f}% (max {100 * out['max_error']:.1f}%)"
          + (f", profiled MAPE {100 * out['mape_profiled']:.1f}%" if profiled else "")
          + (f", replay MAPE {100 * out['mape_replay']:.1f}%" if replay else "")
          + f"; same ranking: {out['same_ranking']} (Spearman {out['spearman']:.2f})", flush=True)
    return out


def emulated(model_name: str, cluster_name: str, n: int, m: int, dispatch: str, iterations: int) -> dict:
    from octopipe.load import load_cluster, load_costs, load_model
    from octopipe.run import CONF_DIR
    from octopipe.runtime.calibrate import local_cluster, measure_loopback
    cfg = OmegaConf.create({"model": OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"),
                            "cluster": OmegaConf.load(CONF_DIR / "cluster" / f"{cluster_name}.yaml"),
                            "cost": OmegaConf.load(CONF_DIR / "cost" / "analytic.yaml"), "pp": n})
    model, cluster = load_model(cfg), load_cluster(cfg)
    costs = load_costs(cfg, model, cluster)
    sim_cluster = local_cluster(n, measure_loopback(cache=Path("runs/cache/loopback_link.json")), like=cluster)
    rows = []
    for name in EMULATED:
        table = build_schedule(name, n, m)
        plan = Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name)
        rows.append(compare(None, plan, costs, sim_cluster, compute="emulated", dispatch=dispatch,
                            iterations=iterations, warmup=1))
    return _group(f"emulated: {model.name} on {cluster_name}, {n} ranks, {m} micro-batches, {dispatch}", rows)


def real(model_name: str, n: int, m: int, dispatch: str, iterations: int, fresh: bool = True,
         rounds: int = 3) -> dict:
    from octopipe.cost.profiled import profiled_costs
    from octopipe.model.build import build_model
    from octopipe.run import CONF_DIR
    from octopipe.runtime.calibrate import local_cluster, measure_loopback
    from octopipe.runtime.cores import available_cores
    from octopipe.runtime.insitu import calibration_table, fit_run
    model = build_model(OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"))
    cluster = local_cluster(n, measure_loopback(cache=Path("runs/cache/loopback_link.json")))
    cost_cfg = OmegaConf.load(CONF_DIR / "cost" / "profiled.yaml")
    if fresh:
        cost_cfg.cache_dir = ""    # profile now, under the machine's present load
    costs = profiled_costs(cost_cfg, model, cluster)
    cal_table = calibration_table(n, m)
    cal_plan = Plan(uniform_partition(model.n_layers, cal_table.n_stages), cal_table, model.name)
    plans = []
    for name in REAL:
        table = build_schedule(name, n, m)
        plans.append(Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name))
    runs: dict[str, list] = {p.table.name: [] for p in [cal_plan] + plans}
    kw = dict(compute="real", dispatch=dispatch, iterations=iterations, warmup=1)
    for r in range(rounds):
        order = [cal_plan] + plans[r % len(plans):] + plans[:r % len(plans)]
        for plan in order:
            runs[plan.table.name].append(launch(model, plan, costs, cluster, **kw))
    measured = list(range(1, 1 + iterations))
    cal_events = [ev for res in runs[cal_table.name] for ev in res.events]
    calibration = fit_run(cal_events, cal_plan.partition, costs, measured, available_cores())
    no_cores = fit_run(cal_events, cal_plan.partition, costs, measured, None)
    rows = [summarise(model, p, runs[p.table.name], costs, cluster, calibration=calibration,
                      grad_check=(i == 0), **kw) for i, p in enumerate(plans)]
    cal_row = summarise(model, cal_plan, runs[cal_table.name], costs, cluster, calibration=calibration,
                        grad_check=False, **kw)
    plain = []
    for p, c in zip(plans, rows):
        pred = no_cores.predict(replace(p, table=runs[p.table.name][0].table), costs, cluster, dispatch)
        plain.append(abs(pred - c.measured_iteration_s) / c.measured_iteration_s)
    print(f"  calibration run (not in the error): measured {cal_row.measured_iteration_s:.4f} s, "
          f"simulated {cal_row.simulated_iteration_s:.4f} s ({100 * cal_row.fidelity_error:.1f}%)")
    return _group(f"real: {model.name}, {n} ranks, {m} micro-batches, {dispatch}, {rounds} rounds", rows,
                  {"calibration": {**cal_row.summary(), **calibration.summary()},
                   "mape_calibrated_without_cores": float(np.mean(plain)),
                   "errors_calibrated_without_cores": dict(zip(REAL, plain))})


def main(argv: list[str] | None = None) -> dict:
    from octopipe.run import write_json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-emulated", action="store_true")
    ap.add_argument("--dispatch", default="strict", choices=["strict", "ready_first"])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="real compute: alternating rounds of launches")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="real-compute rank counts")
    ap.add_argument("--cached-profile", action="store_true",
                    help="reuse the cached layer profile instead of measuring it again first")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    groups = []
    if not args.skip_emulated:
        groups.append(emulated("nemotron_h_8b", "h100_1x8", 8, 16, args.dispatch, args.iterations))
    if not args.skip_real:
        for n in args.ranks:
            groups.append(real("tiny_hybrid", n, args.microbatches, args.dispatch, args.iterations,
                               not args.cached_profile, args.rounds))
    doc = {"cores": os.cpu_count(), "load_average": os.getloadavg(), "groups": groups}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    part = "" if not (args.skip_real or args.skip_emulated) else ("_emulated" if args.skip_real else "_real")
    write_json(out / f"runtime_fidelity{part}.json", doc)
    return doc


if __name__ == "__main__":
    main()
