"""Simulated vs measured iteration time of the runtime, per schedule.

Emulated: the default 8-rank pipeline of a heterogeneous model (analytic costs on the cluster
preset, scaled to sleepable durations) — every action sleeps its modelled time while messages
really travel over loopback gloo. Real: the tiny hybrid preset (8 sequences per micro-batch, so
compute outweighs the per-action overheads) computing on 2 and 4 ranks pinned round-robin to the
cores, the simulator fed per-layer costs calibrated in situ (`octopipe.measure.insitu`: separate
calibration launches of the real runtime on the same ranks, one per partition the schedules
use) and the per-core shared-cores model (`octopipe.sim.core_sharing`), with the offline
`cost=profiled` prediction and a replay of each stage's times observed in the measured
iterations beside it. Before each rank count it waits for a quiet machine (1-minute load below
`--quiet-load`) and prints the load at start and end. Runs alternate: each of `--rounds` rounds
launches the calibration tables and then every schedule (in a rotated order), each launch
discarding `--warmup` iterations; each figure is the median over all measured iterations of all
rounds, with the interquartile range as its spread, so the load that other work puts on the
machine falls on every schedule alike. Reported: the mean and max absolute relative error, and
the ranking judged pair by pair (`bench/ranking.py`: separated pairs vs pairs within noise,
Spearman over all schedules and over the largest mutually separated set).

    python -m octopipe.measure.bench.fidelity [--skip-real] [--skip-emulated] [--rounds 6]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from octopipe.cluster_presets import cluster_from_config
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.profiled import profiled_costs
from octopipe.cost.sources import cost_table
from octopipe.io import write_json
from octopipe.measure.bench.ranking import judge, spearman, spread
from octopipe.measure.insitu import calibration_partition, calibration_tables, fit_run
from octopipe.measure.measured_vs_simulated import Comparison, measure_fidelity, summarise
from octopipe.model.build import build_model
from octopipe.plan import Plan, partition_from_sizes, uniform_partition
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.machine import local_cluster, measure_loopback
from octopipe.runtime.pinning import available_cores, core_ids, pin_map
from octopipe.schedule.library import build_schedule
from octopipe.tune.tuner import TuneOptions, tune

EMULATED = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev")
REAL = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv")


def _tuned(model, costs, cluster, n: int, m: int) -> Plan:
    """The tuner's plan on the offline profile (10 s, whole layers): its own partition and
    placement, so the prediction leans on per-layer costs, not on a calibrated stage."""
    plan = tune(costs, cluster, n, m, TuneOptions({"time_budget_s": 10.0, "split_layers": "off"},
                                                  model=model.name)).plan
    return Plan(plan.partition, replace(plan.table, name="tuned"), model.name, plan.cluster, plan.meta)


def _skewed(model, costs, cluster, n: int, m: int) -> Plan:
    """1F1B with every rank but the first holding one layer: a plan predicted (and measured) far
    slower than the rest, so the ranking has pairs well apart."""
    table = build_schedule("1f1b", n, m)
    sizes = [model.n_layers - (n - 1)] + [1] * (n - 1)
    return Plan(partition_from_sizes(sizes), replace(table, name="1f1b-skewed"), model.name)


EXTRA = {"tuned": _tuned, "skewed": _skewed}


def _group(name: str, rows: list[Comparison], extra: dict | None = None, per_round: int | None = None) -> dict:
    names = [c.schedule for c in rows]
    measured = [c.measured_iteration_s for c in rows]
    simulated = [c.simulated_iteration_s for c in rows]
    samples = [c.measured_samples_s or c.result.iteration_s for c in rows]
    spreads = [spread(x) for x in samples]
    verdict = judge(names, measured, [sp.iqr for sp in spreads], simulated,
                    samples if per_round else None, per_round or 1)
    errs = [c.fidelity_error for c in rows]
    replay = [c.fidelity_error_replay for c in rows if c.fidelity_error_replay is not None]
    profiled = [c.fidelity_error_profiled for c in rows if c.fidelity_error_profiled is not None]
    schedules = [{**c.summary(), "measured_q25_s": sp.q25, "measured_q75_s": sp.q75,
                  "measured_iqr_s": sp.iqr, "measured_samples": sp.n} for c, sp in zip(rows, spreads)]
    out = {"setting": name, "mape": float(np.mean(errs)), "max_error": float(np.max(errs)),
           "same_ranking": verdict["same_order_all"], "spearman": verdict["spearman_all"],
           "ranking": verdict, "schedules": schedules, **(extra or {})}
    if replay:
        out["mape_replay"] = float(np.mean(replay))
    if profiled:
        out["mape_profiled"] = float(np.mean(profiled))
        out["max_error_profiled"] = float(np.max(profiled))
        out["spearman_profiled"] = spearman(measured, [c.simulated_profiled_s for c in rows])
    print(f"\n{name}")
    print(f"  {'schedule':12s} {'measured s':>10s} {'IQR s':>8s} {'IQR/med':>7s} {'simulated s':>11s} "
          f"{'error':>6s} {'profiled err':>12s} {'replay err':>10s}")
    pct = lambda e: "-" if e is None else f"{100 * e:.1f}%"
    for c, sp in zip(rows, spreads):
        print(f"  {c.schedule:12s} {c.measured_iteration_s:10.4f} {sp.iqr:8.4f} {100 * sp.relative:6.1f}% "
              f"{c.simulated_iteration_s:11.4f} {100 * c.fidelity_error:5.1f}% "
              f"{pct(c.fidelity_error_profiled):>12s} {pct(c.fidelity_error_replay):>10s}")
    print(f"  MAPE {100 * out['mape']:.1f}% (max {100 * out['max_error']:.1f}%)"
          + (f", profiled MAPE {100 * out['mape_profiled']:.1f}%" if profiled else "")
          + (f", replay MAPE {100 * out['mape_replay']:.1f}%" if replay else ""))
    _print_verdict(verdict, bool(per_round))
    sys.stdout.flush()
    return out


def _print_verdict(verdict: dict, paired: bool) -> None:
    print(f"  ranking: Spearman {verdict['spearman_all']:.2f} over all {verdict['schedules']} "
          f"(same order: {verdict['same_order_all']}); separated pairs in the same order "
          f"{verdict['separated_pairs_same_order']}/{verdict['separated_pairs']}, pairs within noise "
          f"{verdict['noise_pairs_same_order']}/{verdict['noise_pairs']}; largest mutually separated set "
          f"{verdict['separated_chain']} Spearman {verdict['spearman_separated_chain']:.2f}")
    if paired:
        print(f"  paired by round: {verdict['paired_all_same_order']}/{len(verdict['pairs'])} pairs in the "
              f"simulated order; separated (gap > IQR of per-round differences) "
              f"{verdict['paired_separated_same_order']}/{verdict['paired_separated_pairs']} in the same order")
    for p in verdict["pairs"]:
        line = (f"    {p['a']:>11s} vs {p['b']:<11s} predicted gap {p['predicted_gap_s']:.4f} s, "
                f"noise {p['noise_s']:.4f} s: {'separated' if p['separated'] else 'within noise'}, "
                f"{'same order' if p['same_order'] else 'ORDER DIFFERS'}")
        if p.get("paired_diff_s") is not None:
            line += (f"; paired diff {p['paired_diff_s']:+.4f} s, paired noise {p['paired_noise_s']:.4f} s: "
                     f"{'separated' if p['separated_paired'] else 'within noise'}, "
                     f"{'same order' if p['same_order_paired'] else 'ORDER DIFFERS'}")
        print(line)


def rejudge(path: Path) -> list[dict]:
    """The ranking verdicts of a saved benchmark JSON, recomputed (with the paired comparison)."""
    doc = json.loads(Path(path).read_text())
    out = []
    for g in doc["groups"]:
        if not g["setting"].startswith("real"):
            continue
        rows = g["schedules"]
        verdict = judge([r["schedule"] for r in rows], [r["measured_iteration_s"] for r in rows],
                        [r["measured_iqr_s"] for r in rows], [r["simulated_iteration_s"] for r in rows],
                        [r["measured_iterations_s"] for r in rows], g["iterations"])
        print(f"\n{g['setting']}: MAPE {100 * g['mape']:.1f}%")
        _print_verdict(verdict, True)
        out.append(verdict)
    return out


def emulated(model_name: str, cluster_name: str, n: int, m: int, config: RuntimeConfig) -> dict:
    """Emulated compute of every schedule in EMULATED on `n` ranks, `m` micro-batches."""
    cost = preset("cost", "analytic")
    model = build_model(preset("model", model_name))
    cluster = cluster_from_config(preset("cluster", cluster_name), pp=n, tp=cost.tp)
    costs = cost_table(cost, model, cluster)
    sim_cluster = local_cluster(n, measure_loopback(cache=Path("runs/cache/loopback_link.json")), like=cluster)
    rows = []
    for name in EMULATED:
        table = build_schedule(name, n, m)
        plan = Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name)
        rows.append(measure_fidelity(Job(plan, None, config, costs=costs, cluster=sim_cluster)))
    return _group(f"emulated: {model.name} on {cluster_name}, {n} ranks, {m} micro-batches, {config.dispatch}", rows)


def wait_for_quiet(threshold: float, max_wait_s: float, poll_s: float = 10.0) -> dict:
    """Poll the 1-minute load average until it is below `threshold` (or `max_wait_s` passed), so
    the measurement runs in a quiet window of the shared machine; returns what was seen."""
    t0 = time.monotonic()
    first = os.getloadavg()[0]
    load = first
    while load >= threshold and time.monotonic() - t0 < max_wait_s:
        time.sleep(poll_s)
        load = os.getloadavg()[0]
    waited = time.monotonic() - t0
    print(f"  load: {first:.2f} when asked, {load:.2f} after waiting {waited:.0f} s "
          f"(threshold {threshold}, {'quiet' if load < threshold else 'NOT quiet: gave up waiting'})", flush=True)
    return {"load_when_asked": first, "load_at_start": load, "waited_s": waited, "quiet": load < threshold}


@dataclass(frozen=True)
class RealSetting:
    """The real-compute measurement as the command line sets it."""

    model: str = "tiny_hybrid"
    microbatches: int = 4
    config: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(dispatch="strict"))
    rounds: int = 6
    micro_batch_size: int | None = None
    pin: bool = True                  # ranks pinned round-robin to the cores
    fresh: bool = True                # profile now, under the machine's present load
    schedules: tuple[str, ...] = REAL


def real(setting: RealSetting, n: int, quiet: dict | None = None) -> dict:
    """Real compute on `n` ranks: `setting.rounds` rounds, each launching the calibration tables
    and then every schedule once (in a rotated order); each launch runs the config's warm-up
    (discarded) and measured iterations."""
    config = replace(setting.config, compute="real")
    m, schedules, rounds = setting.microbatches, setting.schedules, setting.rounds
    warmup, iterations, dispatch = config.warmup, config.iterations, config.dispatch
    model = build_model(preset("model", setting.model))
    if setting.micro_batch_size:
        model = replace(model, micro_batch_size=setting.micro_batch_size)
    cluster = local_cluster(n, measure_loopback(cache=Path("runs/cache/loopback_link.json")))
    cost = replace(preset("cost", "profiled"), device="cpu")   # where these gloo ranks compute
    if setting.fresh:
        cost = replace(cost, cache_dir="")                      # profile now, under today's load
    costs = profiled_costs(cost, model, cluster)
    pinned = pin_map(n, core_ids()) if setting.pin else None
    plans = []
    for name in schedules:
        if name in EXTRA:
            plans.append(EXTRA[name](model, costs, cluster, n, m))
            continue
        table = build_schedule(name, n, m)
        plans.append(Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name))
    # calibration tables per partition the schedules use (same stages, looped placement), the
    # split backward on odd micro-batches in even rounds and on even ones in odd rounds
    cal_plans: dict[tuple, list[Plan]] = {}
    for p in plans:
        part = calibration_partition(p)
        if part not in cal_plans:
            cal_plans[part] = [Plan(part, t, model.name) for t in calibration_tables(n, m, part)]
    runs: dict[str, list] = {p.table.name: [] for p in plans}
    cal_runs: dict[tuple, list] = {part: [] for part in cal_plans}
    base = Job(plans[0], model, config, pinned=pinned, costs=costs, cluster=cluster)
    unchecked = replace(config, grad_check=False)
    quiet = quiet or {}
    load_start = os.getloadavg()
    t0 = time.monotonic()
    for r in range(rounds):
        for stages, variants in cal_plans.items():
            cal_runs[stages].append(execute(replace(base, plan=variants[r % 2])))
        for plan in plans[r % len(plans):] + plans[:r % len(plans)]:
            runs[plan.table.name].append(execute(replace(base, plan=plan)))
    load_end = os.getloadavg()
    elapsed = time.monotonic() - t0
    measured = list(range(warmup, warmup + iterations))
    calibrations, plain_fits, cal_rows = {}, {}, []
    for stages, variants in cal_plans.items():
        cal_plan = variants[0]
        cal_events = [ev for res in cal_runs[stages] for ev in res.events]
        calibrations[stages] = fit_run(cal_events, cal_plan.partition, costs, measured, available_cores(), pinned)
        plain_fits[stages] = fit_run(cal_events, cal_plan.partition, costs, measured, None)
        cal_rows.append(summarise(replace(base, plan=cal_plan, config=unchecked), cal_runs[stages][::2],
                                  calibrations[stages]))
    rows = [summarise(replace(base, plan=p, config=config if i == 0 else unchecked), runs[p.table.name],
                      calibrations[calibration_partition(p)]) for i, p in enumerate(plans)]
    plain = []
    for p, c in zip(plans, rows):
        pred = plain_fits[calibration_partition(p)].predict(replace(p, table=runs[p.table.name][0].table), costs,
                                                            cluster, dispatch)
        plain.append(abs(pred - c.measured_iteration_s) / c.measured_iteration_s)
    print(f"  load average (1, 5, 15 min) at start {tuple(round(x, 2) for x in load_start)}, "
          f"at end {tuple(round(x, 2) for x in load_end)}; {elapsed:.0f} s of launches")
    for c, cal in zip(cal_rows, calibrations.values()):
        print(f"  calibration run {c.schedule} (not in the error): measured {c.measured_iteration_s:.4f} s, "
              f"simulated {c.simulated_iteration_s:.4f} s ({100 * c.fidelity_error:.1f}%); "
              f"fitted background load {cal.background:.3f} cores")
    print(f"  ranks pinned to cores {list(pinned)}" if pinned else "  ranks not pinned")
    setting = (f"real: {model.name} (micro-batch {model.micro_batch_size} x {model.seq_len} tokens), "
               f"{n} ranks on {available_cores()} cores{' pinned' if pinned else ''}, {m} micro-batches, "
               f"{dispatch}, {rounds} rounds x {iterations} iterations (+{warmup} warm-up)")
    return _group(setting, rows,
                  {"ranks": n, "microbatches": m, "micro_batch_size": model.micro_batch_size,
                   "pinned": list(pinned) if pinned else None, "rounds": rounds, "iterations": iterations,
                   "warmup": warmup, "load_start": list(load_start), "load_end": list(load_end),
                   "quiet_wait": quiet, "launch_s": elapsed,
                   "calibrations": [{**c.summary(), **cal.summary()} for c, cal in zip(cal_rows,
                                                                                       calibrations.values())],
                   "mape_calibrated_without_cores": float(np.mean(plain)),
                   "errors_calibrated_without_cores": dict(zip(schedules, plain))}, per_round=iterations)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-emulated", action="store_true")
    ap.add_argument("--dispatch", default="strict", choices=["strict", "ready_first"])
    ap.add_argument("--iterations", type=int, default=3, help="measured iterations per launch")
    ap.add_argument("--warmup", type=int, default=1, help="discarded iterations per launch (real compute)")
    ap.add_argument("--rounds", type=int, default=6, help="real compute: alternating rounds of launches")
    ap.add_argument("--microbatches", type=int, default=4, help="real compute: micro-batches per iteration")
    ap.add_argument("--micro-batch-size", type=int, default=8,
                    help="real compute: sequences per micro-batch (the preset has 2; more makes compute "
                         "outweigh the per-action overheads)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="real-compute rank counts")
    ap.add_argument("--model", default="tiny_hybrid", help="real-compute model preset")
    ap.add_argument("--emulated-ranks", type=int, default=8, help="emulated-compute rank count")
    ap.add_argument("--schedules", nargs="+", default=list(REAL),
                    help=f"real-compute schedules (named ones, and {', '.join(EXTRA)}: the tuner's plan and "
                         "a deliberately unbalanced 1F1B)")
    ap.add_argument("--no-pin", action="store_true", help="leave rank placement on cores to the OS")
    ap.add_argument("--quiet-load", type=float, default=1.0,
                    help="real compute: wait until the 1-minute load average is below this")
    ap.add_argument("--quiet-wait", type=float, default=600, help="seconds to wait for that at most")
    ap.add_argument("--cached-profile", action="store_true",
                    help="reuse the cached layer profile instead of measuring it again first")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--rejudge", type=Path, help="only recompute the ranking verdicts of a saved JSON")
    args = ap.parse_args(argv)
    if args.rejudge:
        return {"verdicts": rejudge(args.rejudge)}
    groups = []
    if not args.skip_emulated:
        cluster = "h100_1x8" if args.emulated_ranks <= 8 else "h100_4x8"
        groups.append(emulated("nemotron_h_8b", cluster, args.emulated_ranks, 16,
                               RuntimeConfig(compute="emulated", dispatch=args.dispatch,
                                             iterations=args.iterations, warmup=1)))
    if not args.skip_real:
        setting = RealSetting(args.model, args.microbatches,
                              RuntimeConfig(dispatch=args.dispatch, iterations=args.iterations, warmup=args.warmup),
                              args.rounds, args.micro_batch_size, not args.no_pin, not args.cached_profile,
                              tuple(args.schedules))
        for n in args.ranks:
            print(f"\nreal compute, {n} ranks:", flush=True)
            quiet = wait_for_quiet(args.quiet_load, args.quiet_wait)
            groups.append(real(setting, n, quiet))
    doc = {"cores": os.cpu_count(), "load_average": os.getloadavg(), "argv": sys.argv[1:] if argv is None else argv,
           "groups": groups}
    real_groups = [g for g in groups if g["setting"].startswith("real")]
    if real_groups:
        doc["mape_real"] = float(np.mean([s["fidelity_error"] for g in real_groups for s in g["schedules"]]))
        print(f"\nreal compute, all rank counts: MAPE {100 * doc['mape_real']:.1f}%", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    part = "" if not (args.skip_real or args.skip_emulated) else ("_emulated" if args.skip_real else "_real")
    write_json(out / f"runtime_fidelity{part}.json", doc)
    return doc


if __name__ == "__main__":
    main()
