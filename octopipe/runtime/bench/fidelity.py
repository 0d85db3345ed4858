"""Simulated vs measured iteration time of the runtime, per schedule.

Emulated: the default 8-rank pipeline of a heterogeneous model (analytic costs on the cluster
preset, scaled to sleepable durations) — every action sleeps its modelled time while messages
really travel over loopback gloo. Real: the tiny hybrid preset computing on 2 and 4 ranks, the
simulator fed `cost=profiled` times measured here (and, as a second column, a replay with each
stage's times observed in the measured iterations). Reported: the mean and max absolute relative
error, and whether the simulator ranks the schedules as the measurement does.

    python -m octopipe.runtime.bench.fidelity [--skip-real] [--skip-emulated]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.fidelity import Comparison, compare
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


def _group(name: str, rows: list[Comparison]) -> dict:
    errs = [c.fidelity_error for c in rows]
    replay = [c.fidelity_error_replay for c in rows if c.fidelity_error_replay is not None]
    out = {"setting": name, "mape": float(np.mean(errs)), "max_error": float(np.max(errs)),
           "same_ranking": _ranking_agrees(rows), "spearman": _spearman(rows),
           "schedules": [c.summary() for c in rows]}
    if replay:
        out["mape_replay"] = float(np.mean(replay))
    print(f"\n{name}")
    print(f"  {'schedule':12s} {'measured s':>11s} {'simulated s':>12s} {'error':>7s} {'replay err':>12s}")
    for c in rows:
        replay_e = "-" if c.fidelity_error_replay is None else f"{100 * c.fidelity_error_replay:.1f}%"
        print(f"  {c.schedule:12s} {c.measured_iteration_s:11.4f} {c.simulated_iteration_s:12.4f} "
              f"{100 * c.fidelity_error:6.1f}% {replay_e:>12s}")
    print(f"  MAPE {100 * out['mape']:.1f}% (max {100 * out['max_error']:.1f}%)"
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


def real(model_name: str, n: int, m: int, dispatch: str, iterations: int, fresh: bool = True) -> dict:
    from octopipe.cost.profiled import profiled_costs
    from octopipe.model.build import build_model
    from octopipe.run import CONF_DIR
    from octopipe.runtime.calibrate import local_cluster, measure_loopback
    model = build_model(OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"))
    cluster = local_cluster(n, measure_loopback(cache=Path("runs/cache/loopback_link.json")))
    cost_cfg = OmegaConf.load(CONF_DIR / "cost" / "profiled.yaml")
    if fresh:
        cost_cfg.cache_dir = ""    # profile now, under the machine's present load
    costs = profiled_costs(cost_cfg, model, cluster)
    rows = []
    for name in REAL:
        table = build_schedule(name, n, m)
        plan = Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name)
        rows.append(compare(model, plan, costs, cluster, compute="real", dispatch=dispatch,
                            iterations=iterations, warmup=1))
    return _group(f"real: {model.name}, {n} ranks, {m} micro-batches, {dispatch}", rows)


def main(argv: list[str] | None = None) -> dict:
    from octopipe.run import write_json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-emulated", action="store_true")
    ap.add_argument("--dispatch", default="strict", choices=["strict", "ready_first"])
    ap.add_argument("--iterations", type=int, default=3)
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
            groups.append(real("tiny_hybrid", n, 8, args.dispatch, args.iterations, not args.cached_profile))
    doc = {"cores": os.cpu_count(), "load_average": os.getloadavg(), "groups": groups}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    part = "" if not (args.skip_real or args.skip_emulated) else ("_emulated" if args.skip_real else "_real")
    write_json(out / f"runtime_fidelity{part}.json", doc)
    return doc


if __name__ == "__main__":
    main()
